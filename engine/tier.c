/*
 * tier.c — the table of storage tiers built in, by name, in pipeline order.
 *
 * Key design choice: a table, not a switch (as net/transport.c's transports):
 * a new tier is a file that defines its struct kv__tier_ops, one line here
 * and its declaration in tier.h; engine/store.c opens every tier whose pipeline bit the config sets,
 * in this order, below DRAM. The pipeline names themselves ("dram|ssd") and
 * a tier's own settings are config.c's (doc/architecture.md, "Adding a
 * tier").
 */
#include <string.h>

#include "tier.h"

static const struct kv__tier_ops *const tiers[] = {
    &kv__ssd_tier,        /* persist/ssd.c */
};

const struct kv__tier_ops *kv__tier_at(size_t i)
{
    return i < KV__ARRAY_LEN(tiers) ? tiers[i] : NULL;
}

const struct kv__tier_ops *kv__tier_find(const char *name)
{
    for (size_t i = 0; i < KV__ARRAY_LEN(tiers); i++)
        if (strcmp(tiers[i]->name, name) == 0)
            return tiers[i];
    return NULL;
}

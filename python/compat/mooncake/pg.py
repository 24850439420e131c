"""mooncake.pg — Mooncake's torch.distributed process-group backend
("mooncake") runs collectives over its transfer engine; kvengine has no
counterpart.

Importing this module is how a program registers that backend, so the
import itself says why it cannot be done here.
"""

raise NotImplementedError(
    "mooncake.pg: the 'mooncake' torch.distributed backend runs collectives over Mooncake's "
    "transfer engine; kvengine is a KV-cache store with no transfer engine (use nccl or gloo "
    "for collectives, mooncake.store for KV blocks)")

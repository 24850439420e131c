"""mooncake.spdk_tgt_create — Mooncake's tool that sets up SPDK NVMe-oF
targets over ssh for its NVMe-oF storage segments; kvengine has no
counterpart.

kvengine's SSD tier is a local value log under ssd.path (persist/), not
remote NVMe-oF namespaces, so the names exist for imports and using them
says why.
"""

_WHY = ("mooncake.spdk_tgt_create.%s: SPDK NVMe-oF targets are Mooncake's remote "
        "storage segments; kvengine's SSD tier is a local directory (ssd.path), and it "
        "does not use SPDK or NVMe-oF")


class SPDKTgtCreator:
    def __init__(self, *a, **kw):
        raise NotImplementedError(_WHY % "SPDKTgtCreator")


def parse_arguments(*a, **kw):
    raise NotImplementedError(_WHY % "parse_arguments")


def main(*a, **kw):
    raise NotImplementedError(_WHY % "main")

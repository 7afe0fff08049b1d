"""hopper_profile.py with the default BlockSizes changed by BS=field=value,... (lease_ptxas2.sh)."""

import dataclasses
import os
import sys

sys.path.insert(0, "benchmarks")
import hopper_profile as hp

orig = hp.block_sizes


def bs(*a, **k):
    b = orig(*a, **k)
    for kv in filter(None, os.environ.get("BS", "").split(",")):
        f, v = kv.split("=")
        v = {"True": True, "False": False}.get(v, v)
        v = int(v) if isinstance(v, str) and v.isdigit() else v
        b = dataclasses.replace(b, **{f: v})
    return b


hp.block_sizes = bs
hp.main(sys.argv[1:])

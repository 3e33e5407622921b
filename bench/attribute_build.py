"""What a variant's rebuild costs in `pinwheel attribute`, against a cold build of it.

Makes the attribution tests' upstream (tests/servingproject.py: a compiled C member and
Python modules; PR 11 changes the compiled file, PRs 12-14 only Python), replays the full
stack and each leave-one-out variant, then builds them twice:

- as `pinwheel attribute` does (`flows.attribute.build_variants`): the full stack first,
  then each variant in the same kept engine workspace, with the full stack's wheels as
  `reuse_from`;
- cold: each variant alone, in a fresh workspace, without the compiler cache or reuse.

Prints one row per variant (files changed against the tree built before it, seconds both
ways, the ratio, and whether both ways gave the same wheel bytes) and the totals.

    python bench/attribute_build.py [--work DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

from gitfixture import UPSTREAM_URL, manifest_text  # noqa: E402
from pinwheel import options  # noqa: E402
from pinwheel.compile.pipeline import BuildRequest, build  # noqa: E402
from pinwheel.flows.attribute import AttributeRequest, build_variants  # noqa: E402
from pinwheel.manifest import load  # noqa: E402
from pinwheel.source.result import ReplayRequest  # noqa: E402
from pinwheel.source.variants import VariantRequest, replay_variants  # noqa: E402
from servingproject import BUILD_TABLE, make_serving_upstream  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=None, help="scratch directory (default: a temp)")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="attribute-build."))
    s = make_serving_upstream(work)
    steps = [{"action": "pick", "pr": pr, "head": s.heads[pr], "commits": s.commits[pr]}
             for pr in (11, 12, 13, 14)]  # fmt: skip
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    path = work / "m.toml"
    extra = BUILD_TABLE.format(python=py, max_tokens=25)
    path.write_text(manifest_text(s.base, steps, tag=None, extra=extra))  # type: ignore[arg-type]
    manifest = load(path)
    mirrors = {UPSTREAM_URL: str(s.up.bare)}
    replay = ReplayRequest(manifest, work / "cache", mirrors)
    plan = replay_variants(VariantRequest(replay))
    variants = [v for v in plan.variants if v.result is not None]
    environ = dict(os.environ)
    template = BuildRequest(manifest=manifest, cache=work / "cache", out_dir=work / "unused",
                            host=options.host(environ), mirrors=mirrors, kernels=(),
                            cuda=False)  # fmt: skip
    request = AttributeRequest(VariantRequest(replay), template, work / "inc", "model", environ)
    incremental = build_variants(request, variants, work / "inc")
    cold = {}
    for v in variants:
        out = work / "cold" / v.name
        req = dataclasses.replace(template, replayed=v.result, out_dir=out / "wheels",
                                  engine_workdir=out / "work", compiler_cache=False)  # fmt: skip
        started = time.monotonic()
        outcome = build(req)
        engine = outcome.built[0]
        cold[v.name] = (time.monotonic() - started, outcome.wheels.wheels[engine.wheel.name])
    print(f"{'variant':<10} {'changed':>7} {'attribute s':>11} {'cold s':>7} {'ratio':>6}  "
          "same bytes  reused")  # fmt: skip
    for b in incremental:
        secs, sha = cold[b.variant]
        print(f"{b.variant:<10} {len(b.changed):>7} {b.wall_s:>11.1f} {secs:>7.1f} "
              f"{b.wall_s / secs:>6.2f}  {str(b.sha256 == sha):<10}  {len(b.reused)}")  # fmt: skip
    inc = sum(b.wall_s for b in incremental[1:])
    col = sum(cold[b.variant][0] for b in incremental[1:])
    print(
        f"variants after the full stack: {inc:.1f} s as attribute builds them, {col:.1f} s "
        f"cold: ratio {inc / col:.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Hypothesis profiles: CI is reproducible, a long local or scheduled run keeps finding new inputs.

- `ci` (the default under `CI` truthy): derandomized, so every run of a commit draws the same examples (a
  test's seed is a digest of its source) and a red CI run is red again on a rerun and on a laptop with
  `HYPOTHESIS_PROFILE=ci`; no example database (a clean clone has none to replay anyway).
- `dev` (the default elsewhere): a fresh random seed per run; failures are kept in `.hypothesis/` and
  replayed first on the next run; `--hypothesis-seed=N` reproduces a run's draw.
- `fuzz` (`HYPOTHESIS_PROFILE=fuzz`, wins over `CI`): random like `dev`, more examples for the tests that
  do not set their own count, the failing example printed as a blob; run it in a loop (docs/fuzzing.md).

No profile has a deadline or the `too_slow` health check: on a loaded machine they fail on timing, and no
test here asserts timing. A test's own `@settings` still win over its profile's values.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from hypothesis import HealthCheck, settings

from tests.infra import truthy

PROFILES: Final = ("ci", "dev", "fuzz")


def register() -> None:
    # From Hypothesis's own defaults: under `CI` Hypothesis has already loaded its built-in `ci` profile.
    common = settings(
        settings.get_profile("default"), deadline=None, suppress_health_check=[HealthCheck.too_slow]
    )
    settings.register_profile("ci", common, derandomize=True, database=None, print_blob=True)
    settings.register_profile("dev", common)
    settings.register_profile("fuzz", common, max_examples=2_000, print_blob=True)


def profile_for(environ: Mapping[str, str]) -> str:
    """`HYPOTHESIS_PROFILE` when set; else `ci` under a truthy `CI`, `dev` elsewhere."""
    chosen = environ.get("HYPOTHESIS_PROFILE", "").strip()
    if chosen:
        if chosen not in PROFILES:
            raise ValueError(f"HYPOTHESIS_PROFILE={chosen!r}: one of {', '.join(PROFILES)}")
        return chosen
    return "ci" if truthy(environ.get("CI")) else "dev"

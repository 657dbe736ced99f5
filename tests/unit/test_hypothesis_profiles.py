"""The Hypothesis profile CI runs under draws the same examples every run (tests/hypothesis_profiles.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.hypothesis_profiles import profile_for


@pytest.mark.parametrize(
    ("environ", "profile"),
    [
        ({}, "dev"),
        ({"CI": "false"}, "dev"),
        ({"CI": "true"}, "ci"),
        ({"CI": "1"}, "ci"),
        ({"CI": "true", "HYPOTHESIS_PROFILE": "fuzz"}, "fuzz"),
        ({"HYPOTHESIS_PROFILE": "ci"}, "ci"),
        ({"CI": "true", "HYPOTHESIS_PROFILE": " "}, "ci"),
    ],
)
def test_the_profile_follows_the_environment(environ: dict[str, str], profile: str) -> None:
    assert profile_for(environ) == profile


def test_an_unknown_profile_is_refused() -> None:
    with pytest.raises(ValueError, match="HYPOTHESIS_PROFILE='nightly'"):
        profile_for({"HYPOTHESIS_PROFILE": "nightly"})


def _draws(profile: str) -> list[int]:
    drawn: list[int] = []

    @settings(settings.get_profile(profile), max_examples=20)
    @given(st.integers())
    def record(n: int) -> None:
        drawn.append(n)

    record()
    return drawn


def test_ci_draws_the_same_examples_every_run() -> None:
    ci = settings.get_profile("ci")
    assert (ci.derandomize, ci.database, ci.deadline) == (True, None, None)
    assert _draws("ci") == _draws("ci")


def test_dev_and_fuzz_draw_at_random_and_keep_their_failures() -> None:
    """The other side, even under `CI` (Hypothesis loads its own derandomized profile there first)."""
    for name in ("dev", "fuzz"):
        profile = settings.get_profile(name)
        assert (profile.derandomize, profile.deadline) == (False, None)
        assert profile.database is not None
    assert settings.get_profile("fuzz").max_examples > settings.get_profile("dev").max_examples

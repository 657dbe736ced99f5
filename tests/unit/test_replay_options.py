"""`message-history replay` flags: what is accepted, what each combination means, what is refused (exit 2)."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from pathlib import Path

import pytest

from message_history.app.cli import main as cli_main
from message_history.app.replay.options import ReplayOptions, StartAt, options_from_args
from message_history.app.replay.plan import UsageError, add_replay_arguments
from message_history.settings import Settings

SETTINGS = Settings(
    requests_topic="rq",
    enriched_topic="en",
    responses_topic="rs",
    persisted_topic="pe",
    responses_dlq_topic="rs-dead",
    max_batch_records=321,
)


def parse(*argv: str, tty: bool = False) -> ReplayOptions:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_replay_arguments(parser)
    return options_from_args(parser.parse_args(argv), SETTINGS, tty=tty)


def test_defaults_replay_the_responses_topic_quietly_with_dead_letters() -> None:
    """By default: the responses topic, persist path, nothing emitted, bad records dead-lettered."""
    options = parse("--from-beginning")
    assert options == ReplayOptions(
        topic="rs",
        path="persist",
        start=StartAt(beginning=True),
        dead_letter_topic="rs-dead",
        batch_size=321,
        progress="log",
    )
    assert (options.emits, options.dead_letters) == (False, True)


@pytest.mark.parametrize(
    ("argv", "check"),
    [
        (["--from-offsets", "0:5,2:9"], lambda o: o.start == StartAt(offsets={0: 5, 2: 9})),
        (
            ["--from-timestamp", "2026-01-10T08:00:00Z", "--until-timestamp", "2026-01-10T12:00:00Z"],
            lambda o: (o.start.timestamp, o.until)
            == (datetime(2026, 1, 10, 8, tzinfo=UTC), datetime(2026, 1, 10, 12, tzinfo=UTC)),
        ),
        (
            ["--from-beginning", "--topic", "mirror"],
            lambda o: (o.topic, o.dead_letter_topic) == ("mirror", "mirror.dlq"),
        ),
        (["--from-beginning", "--emit-persisted"], lambda o: o.emits and o.path == "persist"),
        (["--from-beginning", "--emit-persisted", "--dry-run"], lambda o: not o.emits and not o.dead_letters),
        (
            ["--from-beginning", "--emit-to", "side"],
            lambda o: (o.path, o.topic, o.emit_to, o.dead_letter_topic, o.emits)
            == ("recall", "rq", "side", "rq.dlq", True),
        ),
        (["--from-beginning", "--emit-to", "en", "--force"], lambda o: o.emit_to == "en"),
        (["--from-beginning", "--skip-invalid"], lambda o: not o.dead_letters),
        (
            ["--from-beginning", "--invalid-report", "bad.jsonl", "--skip-invalid"],
            lambda o: o.invalid_report == Path("bad.jsonl"),
        ),
        (
            [
                "--from-beginning",
                "--rate",
                "2.5",
                "--concurrency",
                "8",
                "--batch-size",
                "50",
                "--max-retry-s",
                "9",
            ],
            lambda o: (o.rate, o.concurrency, o.batch_size, o.max_retry_s) == (2.5, 8, 50, 9.0),
        ),
        (["--from-beginning", "--progress", "none"], lambda o: o.progress == "none"),
        (["--from-beginning", "--observe"], lambda o: o.observes and o.path == "persist"),
        (["--from-beginning", "--observe"], lambda o: o.observe_wait_s == SETTINGS.observation_timeout_s),
        (["--from-beginning", "--observe", "--observe-wait-s", "7.5"], lambda o: o.observe_wait_s == 7.5),
    ],
    ids=[
        "from-offsets",
        "time-window",
        "other-topic-dlq",
        "emit-persisted",
        "dry-run-emits-nothing",
        "emit-to-is-recall",
        "emit-to-enriched-forced",
        "skip-invalid",
        "report",
        "knobs",
        "progress-none",
        "observe",
        "observe-wait-default",
        "observe-wait",
    ],
)
def test_accepted_combinations(argv: list[str], check: object) -> None:
    """Each accepted flag combination maps to the options it names."""
    assert callable(check)
    assert check(parse(*argv))


@pytest.mark.parametrize(("tty", "mode"), [(True, "bar"), (False, "log")], ids=["terminal", "pipe"])
def test_auto_progress_is_a_bar_on_a_terminal_only(tty: bool, mode: str) -> None:
    """`--progress auto` draws a bar on a terminal and logs lines elsewhere."""
    assert parse("--from-beginning", tty=tty).progress == mode


@pytest.mark.parametrize(
    ("argv", "complaint"),
    [
        (["--from-beginning", "--emit-to", "en"], "live enriched topic"),
        (["--from-beginning", "--emit-to", "side", "--observe"], "--observe is for the responses topic"),
        (["--from-beginning", "--observe", "--dry-run"], "not with --dry-run"),
        (["--from-beginning", "--observe-wait-s", "5"], "--observe-wait-s is for --observe"),
        (["--from-beginning", "--observe", "--observe-wait-s", "0"], "--observe-wait-s must be positive"),
        (["--from-beginning", "--emit-to", "rq"], "must not be the topic being replayed"),
        (["--from-beginning", "--emit-to", "side", "--topic", "rs"], "rs is the responses topic"),
        (
            ["--from-beginning", "--emit-to", "side", "--emit-persisted"],
            "--emit-persisted is for the responses",
        ),
        (["--from-beginning", "--topic", "rq"], "replay it with --emit-to"),
        (["--from-offsets", "0"], "is not PARTITION:OFFSET"),
        (["--from-timestamp", "noon"], "--from-timestamp 'noon'"),
        (
            ["--from-timestamp", "2026-01-10T12:00:00Z", "--until-timestamp", "2026-01-10T08:00:00Z"],
            "must be later",
        ),
        (["--from-beginning", "--rate", "0"], "--rate must be positive"),
        (["--from-beginning", "--max-retry-s", "-1"], "--max-retry-s must be positive"),
        (["--from-beginning", "--concurrency", "0"], "--concurrency must be at least 1"),
        (["--from-beginning", "--batch-size", "0"], "--batch-size must be at least 1"),
    ],
    ids=[
        "emit-to-live-enriched",
        "observe-with-emit-to",
        "observe-dry-run",
        "observe-wait-without-observe",
        "observe-wait-zero",
        "emit-to-source",
        "emit-to-from-responses",
        "emit-both",
        "requests-without-emit-to",
        "bad-offsets",
        "bad-timestamp",
        "until-before-from",
        "rate-zero",
        "retry-negative",
        "concurrency-zero",
        "batch-zero",
    ],
)
def test_refused_combinations(argv: list[str], complaint: str) -> None:
    """Unusable combinations are usage errors that say why."""
    with pytest.raises(UsageError, match=complaint):
        parse(*argv)


@pytest.mark.parametrize(
    "argv",
    [[], ["--from-beginning", "--from-offsets", "0:1"], ["--from-beginning", "--rate", "fast"]],
    ids=["no-start", "two-starts", "not-a-number"],
)
def test_cli_exits_2_on_usage_errors_argparse_catches(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """The console script refuses a missing or doubled start (and non-numbers) with exit code 2."""
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["replay", *argv])
    assert exit_info.value.code == 2
    assert "message-history replay: error:" in capsys.readouterr().err


def test_cli_exits_2_on_usage_errors_found_after_parsing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A refused combination returns 2 with the reason, before connecting to anything."""
    monkeypatch.setenv("MESSAGE_HISTORY_ENRICHED_TOPIC", "live-enriched")
    monkeypatch.setattr("message_history.app.replay.command.start_command", lambda settings: None)  # keep
    # pytest's handlers
    assert cli_main(["replay", "--from-beginning", "--emit-to", "live-enriched"]) == 2
    assert "live enriched topic" in capsys.readouterr().err


def _deploy_replay_args() -> list[tuple[str, list[str]]]:
    import yaml  # noqa: PLC0415

    root = Path(__file__).resolve().parents[2] / "deploy"
    job = yaml.safe_load((root / "k8s" / "replay-job.yaml").read_text())
    [container] = job["spec"]["template"]["spec"]["containers"]
    found = [("deploy/k8s/replay-job.yaml", [str(a) for a in container["args"]])]
    for values in ("helm/message-history/values.yaml", "helm/values-all-on.yaml"):
        args = yaml.safe_load((root / values).read_text())["replay"]["args"]
        found.append((f"deploy/{values}", ["replay", *(str(a) for a in args)]))
    return found


@pytest.mark.parametrize(
    ("where", "argv"), _deploy_replay_args(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_the_replay_jobs_under_deploy_pass_flags_replay_accepts(where: str, argv: list[str]) -> None:
    """The plain Job and the chart's replay args are a valid `message-history replay` command line."""
    assert argv[0] == "replay", where
    parse(*argv[1:])


def test_observe_needs_the_observed_path() -> None:
    """`--observe` without the observed path's topic would claim threads no one answers for: refused."""
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_replay_arguments(parser)
    no_observed = SETTINGS.model_copy(update={"observe_results_topic": ""})
    with pytest.raises(UsageError, match="MESSAGE_HISTORY_OBSERVE_RESULTS_TOPIC"):
        options_from_args(parser.parse_args(["--from-beginning", "--observe"]), no_observed, tty=False)

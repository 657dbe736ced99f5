"""`message-history check` reports failures line by line, exits 1, and never prints a secret."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from message_history.app.check import CheckResult, mask_mongodb_uri


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        pytest.param("mongodb://127.0.0.1:27017", "mongodb://127.0.0.1:27017/", id="no-credentials"),
        pytest.param(
            "mongodb://app:pa55@db1:27017,db2:27017/mastra?authSource=admin",
            "mongodb://app:***@db1:27017,db2:27017/mastra",
            id="password-and-query-dropped",
        ),
        pytest.param(
            "mongodb+srv://app:p%40ss@cluster0.example.net/?retryWrites=true",
            "mongodb+srv://app:***@cluster0.example.net/",
            id="srv-with-escaped-password",
        ),
        pytest.param(
            "mongodb://x509user@host/?authMechanism=MONGODB-X509", "mongodb://x509user@host/", id="user-only"
        ),
        pytest.param("mongodb://u:p:with:colons@host/", "mongodb://u:***@host/", id="colons-in-password"),
    ],
)
def test_mask_mongodb_uri(uri: str, expected: str) -> None:
    """The printed URI keeps scheme, user, hosts and database, and drops the password and the query string."""
    assert mask_mongodb_uri(uri) == expected


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        pytest.param(CheckResult("kafka", True, "h:1", "fine"), "OK   kafka    h:1  fine", id="ok"),
        pytest.param(CheckResult("mongodb", False, "m", "down"), "FAIL mongodb  m  down", id="fail"),
    ],
)
def test_result_line(result: CheckResult, expected: str) -> None:
    """A result prints as one aligned line starting with OK or FAIL."""
    assert result.line() == expected


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.timeout(60)
def test_check_fails_per_dependency_without_leaking_the_password() -> None:
    """With nothing listening, both lines say FAIL, the exit code is 1 and the password is not printed."""
    secret = "s3cr3t-Pa55word"
    env = {name: value for name, value in os.environ.items() if not name.startswith("MESSAGE_HISTORY_")}
    env.update(
        KAFKA_BOOTSTRAP_SERVERS=f"127.0.0.1:{_closed_port()}",
        MONGODB_URI=f"mongodb://app:{secret}@127.0.0.1:{_closed_port()}/?authSource=admin",
        MESSAGE_HISTORY_MONGODB_TIMEOUT_MS="500",
    )
    done = subprocess.run(
        [sys.executable, "-m", "message_history", "check"],
        env=env,
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert [line.split()[:2] for line in done.stdout.splitlines()] == [["FAIL", "kafka"], ["FAIL", "mongodb"]]
    assert secret not in output
    assert "app:***@127.0.0.1" in done.stdout

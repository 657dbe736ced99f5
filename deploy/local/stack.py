"""The local stack without Docker: one Kafka node (KRaft) and SecantusDB (MongoDB wire, WiredTiger), loopback.

Run through `deploy/local/stack COMMAND`; `--help` lists the commands. Standard library only, because
`install` runs before the project's virtualenv exists. Everything it downloads, builds or runs lives under the
git-ignored `.cache/` of the repository (the virtualenv is `.venv/`). Only `up` and `env` write to stdout, and
only `export NAME=value` lines, so that `eval "$(deploy/local/stack up)"` works; progress goes to stderr.
"""

# ruff: noqa: S603 -- running build tools and services is this script's whole job; no command comes from input

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "deploy" / "local"
CACHE = ROOT / ".cache"
STATE_DIR = CACHE / "stack"
STATE_FILE = STATE_DIR / "state.json"
LAST_LOGS = CACHE / "stack-logs"
LOCK_FILE = CACHE / "stack.lock"
STAMPS = CACHE / "stamps"
VENV = ROOT / ".venv"
VENV_PYTHON = VENV / "bin" / "python"
VENV_STAMP = VENV / ".message-history-install-stamp"
KAFKA_POM = HERE / "kafka" / "pom.xml"
KAFKA_LOG4J = HERE / "kafka" / "log4j2.properties"
KAFKA_LIBS = CACHE / "kafka-libs"
# SecantusDB: a MongoDB-compatible server on WiredTiger, GPL-2.0 and beta, so pinned exactly and run as a
# separate development/test server (never in the image or the wheel). The Rust server is the default; the
# Python one (a PyPI wheel, slower) is the fallback where cargo is missing (or STACK_MONGO_SERVER=python).
SECANTUS_RS_CRATE = "secantus-mdb"
SECANTUS_RS_VERSION = "0.5.3-beta.196"
SECANTUS_PY_PACKAGE = "SecantusDB"
SECANTUS_PY_VERSION = "0.7.0b3"
SECANTUS_RS_ROOT = CACHE / "secantus"
SECANTUS_RS_BIN = SECANTUS_RS_ROOT / "bin" / "secantusd-rs"
SECANTUS_PY_VENV = CACHE / "secantus-py"
SECANTUS_PY_BIN = SECANTUS_PY_VENV / "bin" / "secantusd-py"
SECANTUS_CACHE_SIZE = os.environ.get("STACK_SECANTUS_CACHE_SIZE", "1G")
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies"

KAFKA_READY_LINE = "Kafka Server started"
# Sized for a 2-core box shared with the tests: the broker needs far less than Kafka's 1 GiB default here.
KAFKA_HEAP_DEFAULT = "-Xms256m -Xmx768m"
KAFKA_JVM_OPTS = [
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:MaxInlineLevel=15",
    "-Djava.awt.headless=true",
]
START_TIMEOUT_S = float(os.environ.get("STACK_START_TIMEOUT", "120"))
STOP_GRACE_S = 20.0
TAIL_LINES = 40


class StackError(Exception):
    """A step failed; the message says which, and where to look."""


# ----------------------------------------------------------------------------------------------- output


def say(message: str) -> None:
    print(f"stack: {message}", file=sys.stderr, flush=True)


def tail(path: Path, lines: int = TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"  (no log at {path})"
    body = "\n".join(f"  | {line}" for line in text[-lines:]) or "  | (empty)"
    return f"--- last {min(lines, len(text))} lines of {path} ---\n{body}"


def exports(state: dict[str, Any]) -> str:
    return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in state["exports"].items())


# ----------------------------------------------------------------------------------------------- helpers


@contextlib.contextmanager
def locked() -> Iterator[None]:
    """One stack command at a time per work tree (two `up` at once would start two stacks)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with LOCK_FILE.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def run(
    cmd: Sequence[str | Path],
    *,
    cwd: Path = ROOT,
    env: dict[str, str] | None = None,
    what: str,
    heartbeat_s: float = 0.0,
) -> None:
    """Run a build step with its output on stderr; raise StackError naming the step if it fails.

    With `heartbeat_s`, a line every that many seconds says the step still runs and for how long (a long build
    step, WiredTiger's, prints nothing for minutes).
    """
    say(f"{what}: {' '.join(str(part) for part in cmd)}")
    started = time.monotonic()
    try:
        proc = subprocess.Popen([str(part) for part in cmd], cwd=cwd, env=env, stdout=sys.stderr)
    except FileNotFoundError as exc:
        raise StackError(f"{what}: {exc.filename} not found on PATH") from exc
    while True:
        try:
            code = proc.wait(timeout=heartbeat_s or None)
            break
        except subprocess.TimeoutExpired:
            say(f"{what}: still running, {time.monotonic() - started:.0f} s so far")
    if code != 0:
        raise StackError(f"{what} failed (exit {code}); its output is above")


@contextlib.contextmanager
def step(name: str) -> Iterator[Callable[[str], None]]:
    """One install step: says what it does and, at the end, how long it took (or that nothing was needed).

    The body calls the yielded `skip(why)` when it finds the step already done.
    """
    started = time.monotonic()
    skipped: list[str] = []
    say(f"install: {name} ...")
    yield skipped.append
    took = time.monotonic() - started
    if skipped:
        say(f"install: {name}: {skipped[0]} ({took:.1f} s)")
    else:
        say(f"install: {name}: done in {took:.1f} s")


def digest(*parts: bytes | str | Path) -> str:
    hasher = hashlib.sha256()
    for part in parts:
        if isinstance(part, Path):
            hasher.update(part.read_bytes() if part.exists() else b"<missing>")
        elif isinstance(part, str):
            hasher.update(part.encode())
        else:
            hasher.update(part)
        hasher.update(b"\0")
    return hasher.hexdigest()


def stamp_matches(stamp: Path, value: str) -> bool:
    return stamp.exists() and stamp.read_text().strip() == value


def write_stamp(stamp: Path, value: str) -> None:
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text(value + "\n")


def require_tool(name: str, why: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise StackError(f"`{name}` is not on PATH; it is needed to {why}")
    return path


def java_executable() -> str:
    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else require_tool("java", "run Kafka")
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False).stderr
    except OSError as exc:
        raise StackError(f"cannot run {java}: {exc}") from exc
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    major = int(match.group(1)) if match else 0
    if major == 1 and match and match.group(2):  # "1.8.0" style
        major = int(match.group(2))
    if major < 17:
        raise StackError(f"Kafka 4.x needs Java 17 or newer; {java} is: {out.strip().splitlines()[:1]}")
    return java


def free_ports(count: int) -> list[int]:
    """Distinct free loopback ports: all bound at once, so the kernel cannot hand out the same one twice."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def listening_ports() -> set[int]:
    """TCP ports in LISTEN state on any address, from /proc (no side effects, sees IPv6-mapped sockets)."""
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 3 and fields[3] == "0A":  # 0A = TCP_LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def port_accepts(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def kafka_cluster_id() -> str:
    """As Kafka's Uuid.randomUuid(): 22 URL-safe base64 chars, never a leading '-' (argparse reads a flag)."""
    while True:
        candidate = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not candidate.startswith("-"):
            return candidate


# ----------------------------------------------------------------------------------------------- processes


def pid_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie (reaps it first if it is our own child)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def pid_is(pid: int, marker: str) -> bool:
    """The pid is alive and still the process we started (its command line holds our marker): no pid reuse."""
    if not pid_alive(pid):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return True  # no /proc: trust the pid
    return marker in cmdline


def spawn(cmd: Sequence[str | Path], log: Path, cwd: Path) -> int:
    """Start a service in its own session (a Ctrl-C in the terminal does not reach it), output to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [str(part) for part in cmd],
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return proc.pid


def stop_processes(services: dict[str, dict[str, Any]]) -> list[str]:
    """SIGTERM each live service, wait up to STOP_GRACE_S, then SIGKILL; returns what had to be killed."""
    live = {name: svc for name, svc in services.items() if svc["pid"] and pid_is(svc["pid"], svc["marker"])}
    for name, svc in live.items():
        say(f"stopping {name} (pid {svc['pid']})")
        with contextlib.suppress(ProcessLookupError):
            os.kill(svc["pid"], signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline and any(pid_alive(svc["pid"]) for svc in live.values()):
        time.sleep(0.2)
    killed = []
    for name, svc in live.items():
        if pid_alive(svc["pid"]):
            say(f"{name} (pid {svc['pid']}) still running after {STOP_GRACE_S:.0f} s: SIGKILL")
            with contextlib.suppress(ProcessLookupError):
                os.kill(svc["pid"], signal.SIGKILL)
            killed.append(name)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(pid_alive(svc["pid"]) for svc in live.values()):
        time.sleep(0.1)
    return killed


# ----------------------------------------------------------------------------------------------- install


def install_venv(extras: str) -> None:
    """`.venv` with the project: `extras` "" (what the service and the demo run) or "dev" (tests, lint)."""
    with step(
        f"the project's virtualenv .venv ({'with [dev] extras' if extras else 'runtime only'})"
    ) as skip:
        if not VENV_PYTHON.exists():
            run([sys.executable, "-m", "venv", VENV], what="create the virtualenv")
            VENV_STAMP.unlink(missing_ok=True)
        version = subprocess.run(
            [VENV_PYTHON, "-c", "import sys; print(sys.version)"], capture_output=True, text=True, check=False
        )
        if version.returncode != 0:
            raise StackError(f"{VENV_PYTHON} does not run ({version.stderr.strip()}); delete .venv and retry")
        # the image's lock without hashes: pip checks hashes of everything once a constraints file has one,
        # and the editable project has none
        lock = ROOT / "deploy" / "constraints.txt"
        want = digest(ROOT / "pyproject.toml", lock, version.stdout)
        # The stamp is "<digest> <extras>": a dev install also serves a runtime-only request.
        if stamp_matches(VENV_STAMP, f"{want} dev") or stamp_matches(VENV_STAMP, f"{want} {extras}".rstrip()):
            skip("up to date")
            return
        # Constrained by the image's lock, so the tests run the exact runtime versions the image ships.
        target = f".[{extras}]" if extras else "."
        run(
            [
                VENV_PYTHON,
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "-q",
                "-c",
                lock,
                "-e",
                target,
            ],
            what=f"pip install -e {target} into .venv",
        )
        write_stamp(VENV_STAMP, f"{want} {extras}".rstrip())


NATIVE = ROOT / "native"


def pinned_rust_toolchain() -> dict[str, str]:
    """Make native/rust-toolchain.toml's pin buildable offline. rustup installs a pinned toolchain it lacks by
    downloading it, which fails here (registries only): when the pinned version is the one installed under
    another name (`stable`), link it under the pinned name; when no installed toolchain is that version, build
    with the default one and say so (the pin is for reproducible images, not a reason to fail an install)."""
    rustup = shutil.which("rustup")
    pin = NATIVE / "rust-toolchain.toml"
    if rustup is None or not pin.exists():
        return {}
    channel = ""
    for line in pin.read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "channel":
            channel = value.strip().strip('"')

    def rustup_out(*args: str) -> str:
        try:
            return subprocess.run([rustup, *args], capture_output=True, text=True, check=False).stdout.strip()
        except OSError:  # a rustup that cannot run: nothing to link, build as the machine builds
            return ""

    listed = rustup_out("toolchain", "list")
    if (
        not channel
        or not listed
        or any(line.split()[0].startswith(f"{channel}-") for line in listed.splitlines())
    ):
        return {}
    default = rustup_out("run", "stable", "rustc", "--version").split()
    if len(default) > 1 and default[1] == channel:
        sysroot = rustup_out("run", "stable", "rustc", "--print", "sysroot")
        if sysroot and rustup_out("toolchain", "link", channel, sysroot) == "":
            listed = rustup_out("toolchain", "list")
            if any(line.split()[0].startswith(f"{channel}-") for line in listed.splitlines()):
                say(
                    f"linked the installed Rust {channel} as toolchain {channel} (native/rust-toolchain.toml)"
                )
                return {}
    found = " ".join(default[:2]) or "unknown"
    say(f"Rust {channel} (native/rust-toolchain.toml) is not installed: building with the default ({found})")
    return {"RUSTUP_TOOLCHAIN": "stable"}


def install_native() -> None:
    """The recall path's native row codec (native/, Rust via PyO3), built with the machine's cargo, installed
    into .venv; `MESSAGE_HISTORY_ROW_CODEC=auto` then uses it. Not needed by the demo (the Python reference
    serves the same bytes); without cargo it is skipped, and under CI=true its differential test fails."""
    with step("the native row codec (native/, maturin + cargo) into .venv") as skip:
        version = subprocess.run(
            [VENV_PYTHON, "-c", "import sys; print(sys.version)"], capture_output=True, text=True, check=False
        ).stdout
        sources = sorted(p for p in NATIVE.rglob("*") if p.is_file() and "target" not in p.parts)
        want = digest(ROOT / "deploy" / "build-requirements.txt", *sources, version)
        stamp = VENV / ".message-history-native-stamp"  # in the venv: a new .venv builds it again
        if stamp_matches(stamp, want):
            skip("built and installed")
            return
        cargo = shutil.which("cargo")
        if cargo is None:
            skip("skipped: cargo is not on PATH (recall uses the Python reference)")
            return
        # maturin from the image's hashed build lock, so both build the extension the same way
        run(
            [VENV_PYTHON, "-m", "pip", "install", "--disable-pip-version-check", "-q", "--require-hashes",
             "-r", ROOT / "deploy" / "build-requirements.txt"],
            what="install the build backends (deploy/build-requirements.txt) into .venv",
        )  # fmt: skip
        env = dict(
            os.environ,
            **pinned_rust_toolchain(),
            CARGO_TARGET_DIR=str(CACHE / "native-target"),  # kept: warm rebuilds
            PATH=f"{VENV / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",  # the backend runs `maturin`
        )
        run(
            [VENV_PYTHON, "-m", "pip", "install", "--disable-pip-version-check", "-q", "--no-deps",
             "--no-build-isolation", "--force-reinstall", NATIVE],
            env=env,
            what="build and install native/ (message_history_native)",
            heartbeat_s=30.0,
        )  # fmt: skip
        write_stamp(stamp, want)


def install_kafka_libs() -> None:
    with step("Kafka's jars from Maven Central") as skip:
        stamp = STAMPS / "kafka-libs"
        want = digest(KAFKA_POM)
        if stamp_matches(stamp, want) and any(KAFKA_LIBS.glob("kafka_2.13-*.jar")):
            skip(f"up to date in {KAFKA_LIBS.relative_to(ROOT)}")
            return
        mvn = require_tool("mvn", "resolve the Kafka jars from Maven Central")
        CACHE.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix="kafka-libs.", dir=CACHE))
        try:
            # -C (--strict-checksums): a download whose checksum does not match fails instead of being used.
            run(
                [
                    mvn,
                    "-B",
                    "-q",
                    "-C",
                    "-f",
                    KAFKA_POM,
                    DEPENDENCY_PLUGIN,
                    "-DincludeScope=runtime",
                    f"-DoutputDirectory={staging}",
                ],
                what="resolve the Kafka broker jars",
            )
            # Swap jar by jar (a running broker may be loading classes from this folder), then drop the
            # jars of an older pin: left on the classpath they would mix versions.
            KAFKA_LIBS.mkdir(parents=True, exist_ok=True)
            fresh = {jar.name for jar in staging.glob("*.jar")}
            for name in fresh:
                (staging / name).replace(KAFKA_LIBS / name)
            for jar in KAFKA_LIBS.glob("*.jar"):
                if jar.name not in fresh:
                    jar.unlink()
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        write_stamp(stamp, want)
        say(f"{len(list(KAFKA_LIBS.glob('*.jar')))} jars in {KAFKA_LIBS}")


def secantus_rs_built() -> bool:
    stamp = STAMPS / "secantusd-rs"
    return stamp_matches(stamp, digest(SECANTUS_RS_CRATE, SECANTUS_RS_VERSION)) and SECANTUS_RS_BIN.exists()


def mongo_server_kind(full: bool) -> str:
    """Which SecantusDB server the stack runs.

    STACK_MONGO_SERVER decides when set. Otherwise the Rust server once it is built; when it is not, `full`
    (test, CI) builds it if cargo is there (the index-plan proof needs it), and the demo takes the Python
    server, which installs from PyPI in seconds instead of a build of minutes.
    """
    wanted = os.environ.get("STACK_MONGO_SERVER", "").strip().lower()
    if wanted in ("rust", "python"):
        return wanted
    if wanted:
        raise StackError(f"STACK_MONGO_SERVER must be `rust` or `python`, not {wanted!r}")
    if secantus_rs_built() or (full and shutil.which("cargo")):
        return "rust"
    return "python"


def mongo_server_bin(kind: str) -> Path:
    return SECANTUS_RS_BIN if kind == "rust" else SECANTUS_PY_BIN


def install_secantus_rs() -> None:
    with step(f"SecantusDB's Rust server ({SECANTUS_RS_CRATE} {SECANTUS_RS_VERSION})") as skip:
        if secantus_rs_built():
            skip(f"built, {SECANTUS_RS_BIN.relative_to(ROOT)}")
            return
        stamp = STAMPS / "secantusd-rs"
        want = digest(SECANTUS_RS_CRATE, SECANTUS_RS_VERSION)
        cargo = require_tool("cargo", "build SecantusDB's Rust server from crates.io")
        say(
            "building SecantusDB's Rust server from crates.io, once per clone: about 4-8 min on 2 cores "
            "(WiredTiger is compiled from source; the demo does not need it)"
        )
        target = CACHE / "secantus-build"
        env = dict(os.environ, CARGO_TARGET_DIR=str(target))
        # --ignore-rust-version: the crate declares rust-version 1.98 while the machines have rustc 1.95; it
        # builds and runs correctly there, and the smoke run below plus the suite's storage and index-plan
        # tests guard it.
        # --locked: exactly the dependency versions the crate was published with.
        run(
            [
                cargo,
                "install",
                SECANTUS_RS_CRATE,
                "--version",
                SECANTUS_RS_VERSION,
                "--locked",
                "--ignore-rust-version",
                "--root",
                SECANTUS_RS_ROOT,
            ],
            env=env,
            what=f"build SecantusDB's Rust server ({SECANTUS_RS_CRATE} {SECANTUS_RS_VERSION})",
            heartbeat_s=30.0,
        )
        shutil.rmtree(target, ignore_errors=True)  # ~600 MB of build output; the binary is all we keep
        smoke_test_mongo_server(SECANTUS_RS_BIN)
        write_stamp(stamp, want)


def install_secantus_py() -> None:
    with step(f"SecantusDB's Python server ({SECANTUS_PY_PACKAGE} {SECANTUS_PY_VERSION} from PyPI)") as skip:
        stamp = STAMPS / "secantusd-py"
        want = digest(SECANTUS_PY_PACKAGE, SECANTUS_PY_VERSION, sys.version)
        if stamp_matches(stamp, want) and SECANTUS_PY_BIN.exists():
            skip(f"up to date in {SECANTUS_PY_VENV.relative_to(ROOT)}")
            return
        # A virtualenv of its own: the server is GPL-2.0 and must not mix into the project's environment.
        run(
            [sys.executable, "-m", "venv", "--clear", SECANTUS_PY_VENV], what="create SecantusDB's virtualenv"
        )
        run(
            [
                SECANTUS_PY_VENV / "bin" / "python",
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "-q",
                f"{SECANTUS_PY_PACKAGE}=={SECANTUS_PY_VERSION}",
            ],
            what=f"install SecantusDB's Python server ({SECANTUS_PY_PACKAGE} {SECANTUS_PY_VERSION})",
        )
        smoke_test_mongo_server(SECANTUS_PY_BIN)
        write_stamp(stamp, want)


def install_mongo_server(full: bool) -> str:
    kind = mongo_server_kind(full)
    if kind == "rust":
        install_secantus_rs()
        say(f"MongoDB-wire server: SecantusDB Rust server {SECANTUS_RS_VERSION} ({SECANTUS_RS_BIN})")
    else:
        install_secantus_py()
        if os.environ.get("STACK_MONGO_SERVER"):
            why = "STACK_MONGO_SERVER=python"
        elif full:
            why = "cargo not found"
        else:
            why = "the Rust server is not built yet; `deploy/local/stack test` builds it"
        say(f"MongoDB-wire server: SecantusDB Python server {SECANTUS_PY_VERSION} ({why}; {SECANTUS_PY_BIN})")
    return kind


def mongo_server_command(binary: Path, port: int, data: Path) -> list[str | Path]:
    cmd: list[str | Path] = [
        binary,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--storage-path",
        data,
        "--log-level",
        os.environ.get("STACK_SECANTUS_LOG_LEVEL", "WARNING"),
    ]
    if binary == SECANTUS_RS_BIN:
        cmd += ["--cache-size", SECANTUS_CACHE_SIZE]
    return cmd


def smoke_test_mongo_server(binary: Path) -> None:
    """Start the freshly installed server on a scratch directory and make a real round trip through it."""
    with tempfile.TemporaryDirectory(prefix="secantus-smoke.", dir=CACHE) as scratch:
        port = free_ports(1)[0]
        log = Path(scratch) / "server.log"
        data = Path(scratch) / "data"
        data.mkdir()
        pid = spawn(mongo_server_command(binary, port, data), log, Path(scratch))
        try:
            deadline = time.monotonic() + 60
            while not port_accepts(port):
                if not pid_alive(pid) or time.monotonic() > deadline:
                    raise StackError(f"{binary.name} did not start for its smoke test\n{tail(log)}")
                time.sleep(0.2)
            env = {k: v for k, v in os.environ.items() if not k.startswith("MESSAGE_HISTORY_")}
            env.update(
                MONGODB_URI=f"mongodb://127.0.0.1:{port}/?directConnection=true",
                MONGODB_DATABASE="message_history_smoke",
            )
            done = subprocess.run(
                [VENV_PYTHON, "-m", "message_history", "check", "--only", "mongodb", "--timeout", "30"],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0:
                output = done.stdout + done.stderr
                raise StackError(f"{binary.name} failed its smoke test:\n{output}\n{tail(log)}")
            say(f"smoke test of {binary.name}: {done.stdout.strip()}")
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE_S
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if pid_alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def npm_projects() -> list[Path]:
    """Every Node project the tests run: the TypeScript worker package first (the Mastra worker example
    links it), then the interop suites under tests/ and the bench's Mastra anchor (the bench smoke test)."""
    manifests = sorted(
        [*(ROOT / "tests").rglob("package.json"), ROOT / "bench" / "mastra" / "package.json"],
    )
    folders = [m.parent for m in manifests if "node_modules" not in m.parts]
    package = ROOT / "worker-ts"
    return [package, *folders] if (package / "package.json").exists() else folders


# Node 22 for the projects whose `engines` ask for it (the TypeScript worker package and its example: Mastra
# needs >= 22.13): the `node` npm package ships the official binary inside registry packages, so it installs
# from the npm registry alone, into .cache whatever the machine's own Node is. Tests find it at NODE22_BIN.
NODE22_VERSION = "22.23.3"
NODE22_PREFIX = CACHE / "node22"
NODE22_BIN = NODE22_PREFIX / "node_modules" / "node" / "bin"
NPM_QUIET = ("--no-audit", "--no-fund", "--no-save", "--loglevel=error")


def install_node22() -> Path:
    """Node NODE22_VERSION under .cache/node22 (cached by a stamp); returns the folder holding `node`."""
    with step(f"Node {NODE22_VERSION} (npm package `node`)") as skip:
        want = digest(NODE22_VERSION, platform.machine())
        stamp = STAMPS / "node22"
        if stamp_matches(stamp, want) and (NODE22_BIN / "node").exists():
            skip("up to date")
            return NODE22_BIN
        npm = require_tool("npm", "install Node 22 from the npm registry")
        run(
            [npm, "install", "--prefix", NODE22_PREFIX, f"node@{NODE22_VERSION}", *NPM_QUIET],
            what=f"npm install node@{NODE22_VERSION}",
        )
        write_stamp(stamp, want)
    return NODE22_BIN


def wants_node22(manifest: Path) -> bool:
    """The project's `engines.node` starts at 22 or later (">=22.13.0")."""
    engines = json.loads(manifest.read_text()).get("engines", {}).get("node", "")
    found = re.match(r"\s*>=?\s*(\d+)", engines)
    return found is not None and int(found.group(1)) >= 22


def install_npm() -> None:
    for folder in npm_projects():
        relative = folder.relative_to(ROOT)
        with step(f"npm packages of {relative}") as skip:
            manifest, lock = folder / "package.json", folder / "package-lock.json"
            npm = require_tool("npm", f"install the Node packages of {relative}")
            env = None
            if wants_node22(manifest):
                # npm and the `prepare` build run on Node 22 (npm's shebang finds `node` on PATH)
                env = {**os.environ, "PATH": f"{install_node22()}{os.pathsep}{os.environ.get('PATH', '')}"}
            node = shutil.which("node", path=(env or os.environ).get("PATH"))
            if node is None:
                raise StackError(f"`node` is not on PATH; it is needed for the Node packages of {relative}")
            node_version = subprocess.run(
                [node, "--version"], capture_output=True, text=True, check=False
            ).stdout
            # The worker package's sources count too: `npm ci` builds it (its `prepare` script), and the
            # example that links it uses the build.
            package = ROOT / "worker-ts"
            sources = (
                sorted(
                    [
                        *(package / "src").rglob("*.ts"),
                        *package.glob("tsconfig*.json"),
                        *package.glob("scripts/*"),
                    ]
                )
                if folder == package
                else []
            )
            want = digest(manifest, lock, node_version, *sources)
            stamp = STAMPS / ("npm-" + str(relative).replace(os.sep, "__"))
            if stamp_matches(stamp, want) and (folder / "node_modules").is_dir():
                skip("up to date")
                continue
            verb = ["ci"] if lock.exists() else ["install"]
            run(
                [npm, *verb, "--no-audit", "--no-fund", "--loglevel=error"],
                cwd=folder,
                env=env,
                what=f"npm {verb[0]} in {relative}",
            )
            write_stamp(stamp, want)


def install_hooks() -> None:
    """Run every `deploy/**/install-*.sh` (e.g. the Helm chart's tools); each must be idempotent."""
    for script in sorted((ROOT / "deploy").rglob("install-*.sh")):
        if "node_modules" in script.parts:
            continue
        with step(f"{script.relative_to(ROOT)}"):
            run(["bash", script], what=f"run {script.relative_to(ROOT)}")


def install(full: bool) -> str:
    """What the demo needs (`full` False: .venv without dev extras, Kafka, a MongoDB-wire server that installs
    in seconds unless the Rust one is built), or everything the tests need (`full`: the dev extras, the Rust
    server, the Node projects, the Go tools). Returns the MongoDB-wire server's kind."""
    started = time.monotonic()
    install_venv("dev" if full else "")
    install_kafka_libs()
    kind = install_mongo_server(full)
    if full:
        install_native()
        install_npm()
        install_hooks()
    what = "everything" if full else "what the demo needs"
    say(f"install: {what} in place ({time.monotonic() - started:.1f} s)")
    return kind


# ----------------------------------------------------------------------------------------------- state


def load_state() -> dict[str, Any] | None:
    try:
        state: dict[str, Any] = json.loads(STATE_FILE.read_text())
    except (OSError, ValueError):
        return None
    return state


def save_state(state: dict[str, Any]) -> None:
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    scratch = STATE_FILE.with_suffix(".tmp")
    scratch.write_text(json.dumps(state, indent=2) + "\n")
    scratch.replace(STATE_FILE)


def services_alive(state: dict[str, Any]) -> bool:
    return all(pid_is(svc["pid"], svc["marker"]) for svc in state["services"].values())


def probe(state: dict[str, Any], timeout_s: float) -> tuple[bool, str]:
    """A real round trip on both services, through `message-history check` in the project's virtualenv."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("MESSAGE_HISTORY_")}
    env.update(state["exports"])
    env["MONGODB_DATABASE"] = "message_history_stack"  # keep the probe out of the default `mastra` database
    env["MESSAGE_HISTORY_MONGODB_TIMEOUT_MS"] = str(int(timeout_s * 1000))
    done = subprocess.run(
        [VENV_PYTHON, "-m", "message_history", "check", "--timeout", str(timeout_s)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    output = (done.stdout + done.stderr).strip()
    log = STATE_DIR / "probe.log"
    with contextlib.suppress(OSError), log.open("a") as handle:
        handle.write(f"[{datetime.now(UTC).isoformat()}] exit {done.returncode}\n{output}\n")
    return done.returncode == 0, output


# ----------------------------------------------------------------------------------------------- up / down


def write_kafka_config(config: Path, data: Path, port: int, controller_port: int) -> None:
    config.write_text(
        f"""# Written by deploy/local/stack for one run; the data directory is fresh each time.
process.roles=broker,controller
node.id=1
# Static voters: format needs no --standalone flag (and rejects it with static voters since 4.2).
controller.quorum.voters=1@127.0.0.1:{controller_port}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}
advertised.listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs={data}
num.partitions=1
num.network.threads=2
num.io.threads=2
num.recovery.threads.per.data.dir=1
auto.create.topics.enable=true
# One broker: every internal topic has one replica, and one partition so that first use is quick.
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
# No 3 s wait before the first rebalance of every new group.
group.initial.rebalance.delay.ms=0
"""
    )


def start_stack(kind: str) -> dict[str, Any]:
    java = java_executable()
    mongo_bin = mongo_server_bin(kind)
    for needed in (KAFKA_LIBS, mongo_bin, VENV_PYTHON):
        if not needed.exists():
            raise StackError(f"{needed} is missing; run `deploy/local/stack install` (or `install --all`)")
    shutil.rmtree(STATE_DIR, ignore_errors=True)
    kafka_dir, mongo_dir = STATE_DIR / "kafka", STATE_DIR / "secantusdb"
    (kafka_dir / "data").mkdir(parents=True)
    (mongo_dir / "data").mkdir(parents=True)
    kafka_port, controller_port, mongo_port = free_ports(3)
    config = kafka_dir / "server.properties"
    write_kafka_config(config, kafka_dir / "data", kafka_port, controller_port)
    kafka_log, format_log = kafka_dir / "kafka.log", kafka_dir / "format.log"
    mongo_log = mongo_dir / "secantusdb.log"
    classpath = f"{KAFKA_LIBS}/*"  # Java expands the wildcard, not the shell
    log4j = f"-Dlog4j2.configurationFile=file:{KAFKA_LOG4J}"

    say(f"formatting Kafka storage in {kafka_dir / 'data'}")
    with format_log.open("wb") as out:
        formatted = subprocess.run(
            [
                java,
                "-Xmx512m",
                log4j,
                "-cp",
                classpath,
                "kafka.tools.StorageTool",
                "format",
                "-t",
                kafka_cluster_id(),
                "-c",
                str(config),
            ],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        )
    if formatted.returncode != 0:
        raise StackError(f"Kafka storage format failed (exit {formatted.returncode})\n{tail(format_log)}")

    mongo_addr = f"127.0.0.1:{mongo_port}"
    state: dict[str, Any] = {
        "version": 1,
        "root": str(ROOT),
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "ready": False,
        "services": {
            "secantusdb": {
                "pid": 0,
                "marker": f"--storage-path {mongo_dir / 'data'}",
                "kind": kind,
                "server": f"{mongo_bin.name} "
                + (SECANTUS_RS_VERSION if mongo_bin == SECANTUS_RS_BIN else SECANTUS_PY_VERSION),
                "ports": [mongo_port],
                "log": str(mongo_log),
                "data": str(mongo_dir / "data"),
            },
            "kafka": {
                "pid": 0,
                "marker": str(config),
                "ports": [kafka_port, controller_port],
                "log": str(kafka_log),
                "data": str(kafka_dir / "data"),
                "config": str(config),
            },
        },
        "exports": {
            "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{kafka_port}",
            "MONGODB_URI": f"mongodb://{mongo_addr}/?directConnection=true&serverSelectionTimeoutMS=5000",
        },
    }
    services = state["services"]
    services["secantusdb"]["pid"] = spawn(
        mongo_server_command(mongo_bin, mongo_port, mongo_dir / "data"), mongo_log, mongo_dir
    )
    heap = shlex.split(os.environ.get("KAFKA_HEAP_OPTS", KAFKA_HEAP_DEFAULT))
    services["kafka"]["pid"] = spawn(
        [
            java,
            *heap,
            *KAFKA_JVM_OPTS,
            log4j,
            f"-Dkafka.logs.dir={kafka_dir}",
            "-cp",
            classpath,
            "kafka.Kafka",
            config,
        ],
        kafka_log,
        kafka_dir,
    )
    save_state(state)  # recorded before readiness, so that `down` can clean up an interrupted `up`
    say(
        f"started SecantusDB ({mongo_bin.name}, pid {services['secantusdb']['pid']}, port {mongo_port}) and "
        f"Kafka (pid {services['kafka']['pid']}, ports {kafka_port}/{controller_port})"
    )

    deadline = time.monotonic() + START_TIMEOUT_S
    kafka_up = mongo_up = False
    while not (kafka_up and mongo_up):
        for name in ("kafka", "secantusdb"):
            svc = services[name]
            if not pid_alive(svc["pid"]):
                raise StackError(f"{name} exited during start-up\n{tail(Path(svc['log']))}")
        if not kafka_up:
            kafka_up = KAFKA_READY_LINE in kafka_log.read_text(errors="replace")
        if not mongo_up:
            mongo_up = port_accepts(mongo_port)
        if time.monotonic() > deadline:
            waiting = [name for name, up in (("kafka", kafka_up), ("secantusdb", mongo_up)) if not up]
            logs = "\n".join(tail(Path(services[name]["log"])) for name in waiting)
            raise StackError(f"{', '.join(waiting)} not up after {START_TIMEOUT_S:.0f} s\n{logs}")
        time.sleep(0.2)

    ok, output = probe(state, timeout_s=60.0)
    if not ok:
        logs = "\n".join(tail(Path(svc["log"])) for svc in services.values())
        raise StackError(f"readiness round trip failed:\n{output}\n{logs}")
    for line in output.splitlines():
        say(line)
    state["ready"] = True
    save_state(state)
    return state


def up(full: bool) -> dict[str, Any]:
    """Install (`full`: everything, see `install`), then reuse the running stack or start one."""
    with locked():
        kind = install(full)
        state = load_state()
        if state is not None:
            running = state["services"]["secantusdb"].get("kind", "rust")
            if full and running != kind:
                # The demo's stack runs the Python server; the tests need the Rust one (index plans).
                say(f"the running stack has SecantusDB's {running} server, the tests need {kind}: restarting")
                stop_processes(state["services"])
            elif services_alive(state):
                ok, output = probe(state, timeout_s=15.0)
                if ok:
                    say(f"reusing the running stack (started {state['started_at']}, state in {STATE_DIR})")
                    return state
                say(f"the recorded stack runs but fails its round trip; restarting it:\n{output}")
            else:
                say("the recorded stack is gone or partly dead; starting a fresh one")
            stop_processes(state["services"])
        started = time.monotonic()
        try:
            state = start_stack(kind)
        except BaseException:
            recorded = load_state()
            if recorded is not None:
                stop_processes(recorded["services"])
                STATE_FILE.unlink(missing_ok=True)  # keep the logs for reading, forget the dead stack
            raise
        say(f"stack ready in {time.monotonic() - started:.1f} s (logs under {STATE_DIR})")
        return state


def down() -> int:
    with locked():
        state = load_state()
        if state is None:
            say("not running")
            shutil.rmtree(STATE_DIR, ignore_errors=True)
            return 0
        services = state["services"]
        stop_processes(services)
        leftovers = [f"{name} pid {svc['pid']}" for name, svc in services.items() if pid_alive(svc["pid"])]
        ports = {port for svc in services.values() for port in svc["ports"]}
        still_listening = sorted(ports & listening_ports())
        # Keep the last run's logs for a post-mortem; the data goes.
        shutil.rmtree(LAST_LOGS, ignore_errors=True)
        LAST_LOGS.mkdir(parents=True, exist_ok=True)
        for log in [*STATE_DIR.glob("*.log"), *STATE_DIR.glob("*/*.log")]:  # not the Kafka segments in data/
            with contextlib.suppress(OSError):
                shutil.copy2(log, LAST_LOGS / log.name)
        shutil.rmtree(STATE_DIR, ignore_errors=True)
        if leftovers or still_listening:
            say(f"NOT clean: processes {leftovers or 'none'}; listening ports {still_listening or 'none'}")
            return 1
        say(f"stopped; no process or listening port left (ports {sorted(ports)}); last logs in {LAST_LOGS}")
        return 0


def status() -> int:
    state = load_state()
    if state is None:
        print("not running")
        return 1
    listening = listening_ports()
    print(f"stack of {state['root']}, started {state['started_at']} (ready: {state['ready']})")
    print(f"  state     {STATE_DIR}")
    healthy = True
    for name, svc in state["services"].items():
        alive = pid_is(svc["pid"], svc["marker"])
        ports = ", ".join(
            f"{port} ({'listening' if port in listening else 'CLOSED'})" for port in svc["ports"]
        )
        healthy = healthy and alive and all(port in listening for port in svc["ports"])
        print(f"  {name:<9} pid {svc['pid']} ({'alive' if alive else 'DEAD'}), 127.0.0.1 ports {ports}")
        print(f"            log {svc['log']}")
    for name, value in state["exports"].items():
        print(f"  {name}={value}")
    if not healthy:
        print("  some part is down: `deploy/local/stack up` restarts it")
    return 0 if healthy else 1


def install_command(full: bool) -> int:
    with locked():
        install(full)
    return 0


def up_command(full: bool) -> int:
    sys.stdout.write(exports(up(full)))
    return 0


def env_command() -> int:
    state = load_state()
    if state is None or not state.get("ready") or not services_alive(state):
        say("not running (start it with `deploy/local/stack up`)")
        return 1
    sys.stdout.write(exports(state))
    return 0


def run_with_stack(cmd: Sequence[str | Path], full: bool, extra_env: dict[str, str] | None = None) -> int:
    state = up(full)
    env = dict(os.environ)
    env.update(state["exports"])
    for name, value in (extra_env or {}).items():
        env.setdefault(name, value)
    say(f"running: {' '.join(str(part) for part in cmd)}")
    proc = subprocess.Popen([str(part) for part in cmd], cwd=ROOT, env=env)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        return proc.wait()


def test(pytest_args: Sequence[str]) -> int:
    code = run_with_stack([VENV_PYTHON, "-m", "pytest", *pytest_args], full=True)
    if code == 5:
        say("pytest collected no tests: that counts as a failure")
        code = 1
    if os.environ.get("STACK_DOWN_AFTER") == "1":
        down_code = down()
        code = code or down_code
    return code


def demo(args: Sequence[str]) -> int:
    # The service's HTTP endpoint binds every interface by default; on a developer box keep it on loopback.
    extra = {"MESSAGE_HISTORY_HTTP_HOST": "127.0.0.1", "MESSAGE_HISTORY_HTTP_PORT": str(free_ports(1)[0])}
    started = time.monotonic()
    # Only what the demo needs: no dev extras, no Rust build, no Node or Go tooling (`test` installs those).
    code = run_with_stack([VENV / "bin" / "message-history", "demo", *args], full=False, extra_env=extra)
    say(f"demo: exit {code}, {time.monotonic() - started:.1f} s in all (install, start, conversation)")
    return code


# ----------------------------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="deploy/local/stack",
        description="Kafka 4 (KRaft, one node) and SecantusDB (MongoDB wire) on loopback, without Docker.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    install_parser = sub.add_parser(
        "install",
        help="what the demo needs (.venv, Kafka's jars, a SecantusDB server); --all: what the tests need",
    )
    install_parser.add_argument(
        "--all",
        action="store_true",
        help="also the dev extras, SecantusDB's Rust server, the npm packages, Go tools",
    )
    up_parser = sub.add_parser(
        "up", help="start the stack (or reuse a healthy one); prints export lines on stdout"
    )
    up_parser.add_argument("--all", action="store_true", help="install everything first, as `test` does")
    sub.add_parser("env", help="print the export lines of the running stack")
    sub.add_parser("down", help="stop the stack and remove its state")
    sub.add_parser("status", help="what runs where")
    sub.add_parser("test", help="install everything, up, then `pytest ARGS...` with the stack's environment")
    sub.add_parser("demo", help="install what the demo needs, up, then `message-history demo ARGS...`")
    argv = list(sys.argv[1:] if argv is None else argv)
    # test/demo pass every following argument through untouched (argparse would claim `-k`, `--help`...).
    passthrough = argv[1:] if argv[:1] in (["test"], ["demo"]) else []
    args = parser.parse_args(argv[:1] if passthrough else argv)
    commands: dict[str, Callable[[], int]] = {
        "install": lambda: install_command(args.all),
        "up": lambda: up_command(args.all),
        "env": env_command,
        "down": down,
        "status": status,
        "test": lambda: test(passthrough),
        "demo": lambda: demo(passthrough),
    }
    try:
        return commands[args.command]()
    except StackError as exc:
        say(f"FAILED: {exc}")
        return 1
    except KeyboardInterrupt:
        say("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())

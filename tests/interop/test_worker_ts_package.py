"""The TypeScript worker package as an agent developer gets it: `npm pack`, then a fresh ESM project and a
fresh CommonJS project (`npm init -y`) installing the tarball, compiled by `tsc` with only the settings the
package's README names (worker-ts/README.md, "In your project"), and run under Node 22. The ESM project builds
a Mastra Agent's handler (`skipLibCheck`, for Mastra's own declaration files); the CommonJS one has no
`skipLibCheck` and `require()`s the `./mastra` entry point. Programs: tests/interop/worker-ts-package/."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.interop.node22 import PACKAGE, node22, node22_env

pytestmark = [pytest.mark.interop, pytest.mark.timeout(600)]

# What the README tells a project to put in its tsconfig.json (plus `skipLibCheck` with Mastra).
TSCONFIG = {"compilerOptions": {"module": "nodenext", "target": "es2022", "strict": True, "outDir": "dist"}}
TOOLS = ("typescript@5.9.3", "@types/node@22.20.7")

# The handler's behaviour is the same in both projects: the turn in, the response out, printed.
ENRICHED = {
    "schemaVersion": 1,
    "requestId": "r1",
    "eventId": "r1",
    "threadId": "t1",
    "resourceId": "u1",
    "createdAt": "2026-01-01T00:00:00.000Z",
    "history": {"recalled": 0, "limit": 40},
    "messages": [
        {
            "id": "m1",
            "role": "user",
            "createdAt": "2026-01-01T00:00:00.000Z",
            "type": "v2",
            "content": {"format": 2, "parts": [{"type": "text", "text": "hello"}]},
            "source": "input",
        }
    ],
}

HERE = Path(__file__).resolve().parent / "worker-ts-package"


def _run(cmd: list[str], cwd: Path, timeout: float = 300) -> str:
    done = subprocess.run(
        cmd, cwd=cwd, env=node22_env(), capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"{' '.join(cmd)}:\n{done.stdout[-4000:]}{done.stderr[-4000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def tarball(tmp_path_factory: pytest.TempPathFactory) -> Path:
    node22()
    if not (PACKAGE / "node_modules" / "typescript").is_dir():
        pytest.fail("worker-ts/node_modules is missing (run `deploy/local/stack install --all`)")
    out = tmp_path_factory.mktemp("pack")
    _run(["npm", "pack", "--pack-destination", str(out), "--loglevel=error"], PACKAGE)
    [packed] = out.glob("*.tgz")
    return packed


def _project(root: Path, tarball: Path, *, esm: bool, main: str, extra: tuple[str, ...] = ()) -> str:
    root.mkdir()
    _run(["npm", "init", "-y"], root)
    if esm:
        _run(["npm", "pkg", "set", "type=module"], root)
    quiet = ["--prefer-offline", "--no-audit", "--no-fund", "--loglevel=error"]
    _run(["npm", "install", str(tarball), *TOOLS, *extra, *quiet], root)
    (root / "src").mkdir()
    (root / "src" / "main.ts").write_text(main)
    config = json.loads(json.dumps(TSCONFIG))
    if extra:
        config["compilerOptions"]["skipLibCheck"] = True
    (root / "tsconfig.json").write_text(json.dumps(config))
    _run(["npx", "tsc", "-p", "."], root)
    return _run(["node", "dist/main.js", json.dumps(ENRICHED)], root)


def _check(output: str, module: str) -> None:
    line = json.loads(output.strip().splitlines()[-1])
    assert (line["module"], line["run"], line["mastra"]) == (module, "function", "function")
    assert line["testing"] == "echo: 1 message(s) on t2"  # the ./testing entry point
    response = line["response"]
    assert (response["requestId"], response["threadId"], response["finishReason"]) == ("r1", "t1", "stop")
    assert response["response"][0]["content"]["parts"][0]["text"] == "echo: 1 message(s) on t1"


def test_a_fresh_esm_project_compiles_strict_and_runs_a_mastra_worker(tarball: Path, tmp_path: Path) -> None:
    main = (HERE / "esm-main.ts").read_text()
    output = _project(tmp_path / "esm", tarball, esm=True, main=main, extra=("@mastra/core@1.71.0",))
    _check(output, "esm")


def test_a_fresh_commonjs_project_compiles_strict_and_requires_the_package(
    tarball: Path, tmp_path: Path
) -> None:
    root = tmp_path / "cjs"
    output = _project(root, tarball, esm=False, main=(HERE / "cjs-main.ts").read_text())
    assert "require(" in (root / "dist" / "main.js").read_text()
    _check(output, "cjs")


def _generator(node: str, root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [node, "scripts/generate-events.mjs", "--check"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_generated_event_types_are_current_with_the_schemas() -> None:
    """worker-ts/src/generated/ is what scripts/generate-events.mjs makes of schemas/generated/ now (after a
    schema change: `npm run generate` in worker-ts/)."""
    done = _generator(node22(), PACKAGE)
    assert done.returncode == 0, done.stderr


def test_the_drift_check_fails_on_a_schema_change(tmp_path: Path) -> None:
    """The same check on a copy whose EnrichedRequest schema gained a field: not current."""
    node = node22()
    copy = tmp_path / "worker-ts"
    shutil.copytree(PACKAGE / "scripts", copy / "scripts")
    shutil.copytree(PACKAGE / "src" / "generated", copy / "src" / "generated")
    (copy / "node_modules").symlink_to(PACKAGE / "node_modules")
    shutil.copytree(PACKAGE.parent / "schemas" / "generated", tmp_path / "schemas" / "generated")
    assert _generator(node, copy).returncode == 0
    path = tmp_path / "schemas" / "generated" / "EnrichedRequest.schema.json"
    schema = json.loads(path.read_text())
    schema["$defs"]["HistoryInfo"]["properties"]["newField"] = {"type": "integer"}
    path.write_text(json.dumps(schema))
    done = _generator(node, copy)
    assert done.returncode == 1
    assert "not current with schemas/generated: src/generated/events.ts" in done.stderr

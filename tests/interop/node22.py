"""Node 22 for the TypeScript worker package's tests: `deploy/local/stack install --all` installs it under
.cache/node22 from the npm registry (the `node` package), whatever the machine's own Node is (Mastra needs
>= 22.13, the package's default Kafka client @platformatic/kafka >= 22.22). Missing, the tests skip with the
reason (they fail under CI)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.infra import skip_or_fail

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "worker-ts"
NODE22_BIN = ROOT / ".cache" / "node22" / "node_modules" / "node" / "bin"


def node22() -> str:
    node = NODE22_BIN / "node"
    if not node.exists():
        skip_or_fail(f"{node} is missing (run `deploy/local/stack install --all`)")
    return str(node)


def node22_env() -> dict[str, str]:
    """The environment with Node 22 first on PATH (npm, npx and scripts then run on it)."""
    return {**os.environ, "PATH": f"{NODE22_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}


def build_package(node: str) -> None:
    """`npm run build` of worker-ts (dist/esm and dist/cjs), so its dist/ matches its sources."""
    for step in (
        ["node_modules/typescript/bin/tsc", "-p", "tsconfig.build.json"],
        ["node_modules/typescript/bin/tsc", "-p", "tsconfig.cjs.json"],
        ["scripts/mark-cjs.mjs"],
    ):
        done = subprocess.run(
            [node, *step], cwd=PACKAGE, capture_output=True, text=True, timeout=180, check=False
        )
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]

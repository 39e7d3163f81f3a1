"""The README's quickstart blocks (curl, then the Python client) run as written against a
fresh ``rollplan serve``: only the address is the test server's."""

from __future__ import annotations

import random
import re
import subprocess
from pathlib import Path

from conftest import ServerProcess

README = Path(__file__).resolve().parents[1] / "README.md"


def _block(after_heading: str, lang: str) -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index(after_heading)
    m = re.compile(rf"```{lang}\n(.*?)```", re.S).search(text, start)
    assert m, f"no {lang} block after {after_heading!r}"
    return m.group(1)


def test_readme_quickstart_blocks_run_as_written(tmp_path):
    server = ServerProcess(f"sqlite:///{tmp_path / 'readme.db'}", tmp_path).start()
    try:
        host = server.url.removeprefix("http://")
        curl = _block("### With curl", "bash")
        assert "localhost:8321" in curl
        # Every curl must succeed (the README's lines carry no -f); the block itself is verbatim.
        script = 'curl() { command curl -sS --fail-with-body "$@"; echo; }\n' + curl.replace("localhost:8321", host)
        out = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        assert '"accepted":1' in out.stdout and '"rollouts":8' in out.stdout  # the report and the prompt's estimate

        code = _block("### With the Python client", "python")
        assert "127.0.0.1:8321" in code
        rng = random.Random(0)
        calls = []

        def my_rollouts(prompt_id: str, n: int) -> list[int]:
            calls.append((prompt_id, n))
            return [int(rng.random() < 0.4) for _ in range(n)]

        exec(compile(code.replace("127.0.0.1:8321", host), "README.md (Python quickstart)", "exec"),
             {"my_rollouts": my_rollouts})
        import httpx

        stats = httpx.get(f"{server.url}/v1/runs/demo-py", timeout=30).json()["stats"]
        assert stats["prompts"] == 10_000 and stats["plans"] == 20 and stats["results"] == len(calls) == 20 * 64
    finally:
        server.stop()

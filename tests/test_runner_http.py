"""The all-in-one's HTTP port as an operator and a scraper meet it: /metrics answers Prometheus
without a token in token mode (no redirect)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.support.runner import Running, start

pytestmark = pytest.mark.slow


async def _up(data_dir: Path, *flags: str) -> Running:
    return await start("up", "--port", "0", "--data-dir", str(data_dir), "--require-auth", *flags)


async def test_metrics_answer_a_scrape_without_a_token_in_token_mode(tmp_path):
    running = await _up(tmp_path / "data")
    try:
        assert "auth=tokens" in running.line and "tls=" not in running.line
        async with httpx.AsyncClient(base_url=f"http://{running.http}", timeout=30) as client:
            # Exactly what Prometheus asks (path /metrics, no redirect followed): the text itself.
            for path in ("/metrics", "/metrics/"):
                scraped = await client.get(path)
                assert scraped.status_code == 200, (path, scraped.status_code, scraped.text[:300])
                assert scraped.headers["content-type"].startswith("text/plain")
                assert "# TYPE " in scraped.text and "# HELP " in scraped.text
            assert (await client.get("/healthz")).status_code == 200
            # What is not public still needs the token.
            refused = await client.get("/api/sessions/s1/learning", params={"company": "acme"})
            assert refused.status_code == 401 and refused.json()["error"]["reason"] == "CREDENTIAL_MISSING"
    finally:
        assert await running.stop() == 0

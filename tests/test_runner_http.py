"""The all-in-one's HTTP port as an operator and a scraper meet it: /metrics answers Prometheus
without a token in token mode (no redirect), the HTTP port speaks TLS whenever the gRPC port does,
``./run token issue`` refuses what no request could use, and ``./run demo`` carries a token."""

from __future__ import annotations

import asyncio
import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support.certs import Authority
from tests.support.runner import ROOT, Running, clean_env, run_once, start
from tests.test_inspector_support import csrf_of

pytestmark = pytest.mark.slow


async def _up(data_dir: Path, *flags: str) -> Running:
    return await start("up", "--port", "0", "--data-dir", str(data_dir), "--require-auth", *flags)


def _issue(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_once("token", "issue", *args, data_dir=data_dir, env=clean_env(), timeout=120)


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


async def test_the_http_port_speaks_tls_with_the_grpc_port_certificate(tmp_path):
    authority = Authority()
    issued = authority.issue("agentlearn")
    (cert := tmp_path / "cert.pem").write_bytes(issued.cert)
    (key := tmp_path / "key.pem").write_bytes(issued.key)
    data = tmp_path / "data"
    running = await _up(data, "--tls-cert", str(cert), "--tls-key", str(key))
    try:
        assert "tls=on(grpc,http)" in running.line, running.line
        trusted = ssl.create_default_context(cadata=authority.pem.decode())
        async with httpx.AsyncClient(base_url=f"https://{running.http}", verify=trusted, timeout=30) as client:
            assert (await client.get("/healthz")).text == "ok\n"
            assert (await client.get("/metrics")).status_code == 200
            # The inspector sees https: its sign-in cookie is Secure (cookie_secure auto).
            token = (await asyncio.to_thread(_issue, data, "--company", "acme", "--scopes", "admin")).stdout.strip()
            form = await client.get("/inspector/signin")
            signed = await client.post("/inspector/signin", data={"csrf": csrf_of(form.text), "token": token})
            assert signed.status_code == 303, signed.text[:300]
            assert "secure" in {a.strip().lower() for a in signed.headers["set-cookie"].split(";")}
        # Plain HTTP on the same port gets no answer: nothing crosses it in clear.
        async with httpx.AsyncClient(base_url=f"http://{running.http}", timeout=10) as client:
            with pytest.raises(httpx.HTTPError):
                await client.get("/healthz")
    finally:
        assert await running.stop() == 0


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--company", "ac me"), "company 'ac me' is not a valid handle"),
        (("--company", "acme", "--seat", "a/b c"), "seat 'a/b c' is not a valid handle"),
        (("--company", "acme", "--user", " dana"), "user ' dana' is not a valid handle"),
        (("--company", "acme", "--ttl-days", "-5"), "--ttl-days must be 1..36500"),
        (("--company", "acme", "--ttl-days", "0"), "--ttl-days must be 1..36500"),
        (("--company", "acme", "--ttl-days", "99999999"), "--ttl-days must be 1..36500"),
    ],
)
def test_token_issue_refuses_what_no_request_could_use_in_one_line(tmp_path, args, said):
    data = tmp_path / "data"
    done = _issue(data, *args, "--scopes", "memory:read")
    assert done.returncode == 2, (done.stdout, done.stderr[-2000:])
    assert done.stdout == ""  # no token printed
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("./run token issue: ") and said in lines[0], done.stderr
    assert not (data / "postgres").exists()  # refused before any database was started


def _demo(address: str, *args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
    env = clean_env({"AGENTLEARN_TOKEN": token} if token else None)
    return subprocess.run(
        [sys.executable, "-m", "services.runner", "demo", "--address", address, "--company", "globex", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


async def test_the_demo_sends_a_token_and_a_refusal_is_one_line(tmp_path):
    data = tmp_path / "data"
    running = await _up(data)
    try:
        bare = await asyncio.to_thread(_demo, running.address)
        assert bare.returncode == 2, bare.stderr[-2000:]
        assert bare.stderr.strip().splitlines() == [bare.stderr.strip()], bare.stderr[-2000:]  # no traceback
        assert bare.stderr.startswith("./run demo: UNAUTHENTICATED: ") and "AGENTLEARN_TOKEN" in bare.stderr
        # A token is sent (from the environment, or --token): this one is of another company, so the
        # services answer PERMISSION_DENIED, which they can only say of a token they received.
        issued = await asyncio.to_thread(_issue, data, "--company", "acme", "--scopes", "admin")
        token = issued.stdout.strip()
        for done in await asyncio.gather(
            asyncio.to_thread(_demo, running.address, token=token),
            asyncio.to_thread(_demo, running.address, "--token", token),
        ):
            assert done.returncode == 2, done.stderr[-2000:]
            assert done.stderr.startswith("./run demo: PERMISSION_DENIED: "), done.stderr[-2000:]
            assert len(done.stderr.strip().splitlines()) == 1
    finally:
        assert await running.stop() == 0

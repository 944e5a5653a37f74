"""Real Prometheus, Alertmanager and promtool for tests, unpacked from Debian's packages by
``scripts/observability-tools`` (no daemon is installed or started system-wide).

Without the binaries a test fails (scripts/test fetches them first); it never skips.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from ckpt_ha.lab.devstack import procs

ROOT = Path(__file__).resolve().parents[2]
OBSERVABILITY = ROOT / "observability"
PAGER_URL = "http://127.0.0.1:9095/ckpt-ha/page"
TICKET_URL = "http://127.0.0.1:9095/ckpt-ha/ticket"
"""The receiver URLs in observability/alertmanager.yml that a test replaces with its own."""


def tools() -> Path:
    """The folder holding prometheus, promtool and alertmanager (fetched once, then cached)."""
    done = subprocess.run(
        [str(ROOT / "scripts" / "observability-tools")],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:  # a missing tool fails the test, like a missing service: never a skip
        pytest.fail(f"prometheus/alertmanager binaries unavailable: {done.stderr[-1500:]}")
    return Path(done.stdout.strip().splitlines()[-1])


@dataclass
class Webhook:
    """An Alertmanager webhook receiver: every notification body, by request path."""

    port: int = 0
    received: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def alerts(self, path: str) -> list[dict[str, Any]]:
        with self.lock:
            return [a for p, body in self.received if p == path for a in body.get("alerts", [])]

    def wait_for(self, path: str, match: Any, timeout: float) -> dict[str, Any]:
        """The first alert posted to ``path`` for which ``match(alert)`` is true."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for alert in self.alerts(path):
                if match(alert):
                    return alert
            time.sleep(0.2)
        raise AssertionError(f"no matching alert at {path} within {timeout}s: {self.alerts(path)}")


@contextmanager
def webhook() -> Iterator[Webhook]:
    hook = Webhook()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with hook.lock:
                hook.received.append((self.path, json.loads(body or b"{}")))
            self.send_response(200)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    hook.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hook
    finally:
        server.shutdown()
        server.server_close()


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{url} exited {proc.returncode}: {log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} not ready within {timeout}s: {log.read_text()[-3000:]}")


@contextmanager
def _daemon(
    args: Sequence[str], log: Path, ready_url: str, cwd: Path | None = None
) -> Iterator[None]:
    with log.open("wb") as out:
        proc = subprocess.Popen(list(args), stdout=out, stderr=subprocess.STDOUT, cwd=cwd)
    try:
        _wait_ready(ready_url, proc, log)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)


@contextmanager
def alertmanager(bin_dir: Path, work: Path, hook: Webhook) -> Iterator[str]:
    """Alertmanager with the shipped config, receivers pointed at ``hook``, short group waits.
    Yields its address (host:port)."""
    work.mkdir(parents=True, exist_ok=True)
    text = (OBSERVABILITY / "alertmanager.yml").read_text()
    assert PAGER_URL in text
    assert TICKET_URL in text
    base = f"http://127.0.0.1:{hook.port}"
    text = text.replace(PAGER_URL, f"{base}/page").replace(TICKET_URL, f"{base}/ticket")
    text = text.replace("group_wait: 10s", "group_wait: 1s").replace(
        "group_wait: 5m", "group_wait: 1s"
    )
    config = work / "alertmanager.yml"
    config.write_text(text)
    port = procs.free_port()
    args = [
        str(bin_dir / "alertmanager"),
        f"--config.file={config}",
        f"--storage.path={work / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",
    ]
    # Its working directory resolves the default template (see scripts/observability-tools).
    ready = f"http://127.0.0.1:{port}/-/ready"
    with _daemon(args, work / "alertmanager.log", ready, cwd=bin_dir.parent):
        yield f"127.0.0.1:{port}"


@contextmanager
def prometheus(
    bin_dir: Path, work: Path, targets: Sequence[str], alertmanager_at: str
) -> Iterator[Prometheus]:
    """Prometheus scraping ``targets`` every second, evaluating alerts.yml every second."""
    scrape = {
        "job_name": "ckpt-ha",
        "metrics_path": "/metrics",
        "static_configs": [{"targets": list(targets)}],
    }
    with prometheus_of(bin_dir, work, [scrape], alertmanager_at) as prom:
        yield prom


@contextmanager
def prometheus_of(
    bin_dir: Path,
    work: Path,
    scrape_configs: Sequence[dict[str, Any]],
    alertmanager_at: str | None = None,
    rule_files: Sequence[Path] = (OBSERVABILITY / "alerts.yml",),
) -> Iterator[Prometheus]:
    """Prometheus with these scrape configs and rule files, scraping and evaluating every
    second (alerts sent to ``alertmanager_at`` when given)."""
    work.mkdir(parents=True, exist_ok=True)
    config = work / "prometheus.yml"
    doc: dict[str, Any] = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(f) for f in rule_files],
        "scrape_configs": list(scrape_configs),
    }
    if alertmanager_at is not None:
        doc["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager_at]}]}]}
    config.write_text(json.dumps(doc))
    port = procs.free_port()
    args = [
        str(bin_dir / "prometheus"),
        f"--config.file={config}",
        f"--storage.tsdb.path={work / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    with _daemon(args, work / "prometheus.log", f"http://127.0.0.1:{port}/-/ready"):
        yield Prometheus(f"http://127.0.0.1:{port}")


@dataclass(frozen=True)
class Prometheus:
    url: str

    def query(self, promql: str) -> dict[str, Any]:
        """The HTTP API's answer to an instant query (``status`` is ``success`` or ``error``)."""
        data = urllib.parse.urlencode({"query": promql}).encode()
        request = urllib.request.Request(f"{self.url}/api/v1/query", data=data)
        try:
            with urllib.request.urlopen(request, timeout=10) as resp:
                answer: dict[str, Any] = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            answer = json.loads(exc.read())
        return answer

    def values(self, promql: str) -> list[dict[str, Any]]:
        """The result of an instant query (its series: ``metric`` labels and ``value``)."""
        answer = self.query(promql)
        assert answer["status"] == "success", answer
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    def wait_until_empty(self, promql: str, timeout: float) -> None:
        """Until ``promql`` has no result."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.values(promql):
                return
            time.sleep(0.5)
        raise AssertionError(f"{promql} still had {self.values(promql)} after {timeout}s")

    def wait_for(self, promql: str, timeout: float) -> list[dict[str, Any]]:
        """The non-empty result of ``promql`` once it has one."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            answer = self.query(promql)
            assert answer["status"] == "success", answer
            if answer["data"]["result"]:
                result: list[dict[str, Any]] = answer["data"]["result"]
                return result
            time.sleep(0.5)
        raise AssertionError(f"{promql} stayed empty for {timeout}s")

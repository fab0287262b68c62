"""Prometheus metrics and a /healthz probe on an HTTP endpoint that is off unless asked for."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Any

import structlog

from agents import __version__
from agents.core.health import DeviceHealth, signals_of
from agents.errors import ConfigError
from agents.exposition import CONTENT_TYPE, Collector, Counter, Family, Gauge, Histogram, Registry
from agents.kernel.catalogue import Resource

log = structlog.get_logger(__name__)

RPC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05, 0.25, 1.0)
TEXT = "text/plain; charset=utf-8"
READ_TIMEOUT_S = 5.0  # a scraper sends its request at once; a silent client is dropped
# The always-on gauges of signal readings (agents/core/readings.py), `node_agent_<name>`
# with labels resource and device.
READINGS = {
    "gpu_pcie_link_width": "PCIe link width of the GPU now, in lanes",
    "gpu_pcie_link_width_max": "Widest PCIe link the GPU and its slot can train, in lanes",
    "gpu_pcie_link_gen": "PCIe link generation of the GPU now",
    "gpu_pcie_link_gen_max": "Highest PCIe link generation the GPU can train",
    "gpu_utilization_percent": "Percent of the last sample period a kernel ran on the GPU",
    "gpu_pcie_replays": "NVML's PCIe replay counter of the GPU (only grows)",
    "gpu_nvlinks": "NVLinks NVML lists for the GPU",
    "gpu_nvlinks_active": "NVLinks of the GPU that are active now",
    "gpu_hw_slowdown": "Whether the hardware slows the GPU (slowdown, thermal, brake): 1 or 0",
    "gpu_row_remap_pending": "Whether a row remap waits for a GPU reset: 1 or 0",
    "gpu_row_remap_failed": "Whether a row remap ever failed (the GPU needs replacing): 1 or 0",
    "gpu_retired_pages_pending": "Whether a page retirement waits for a GPU reset: 1 or 0",
    "gpu_fabric_health_mask": "NVML's NVLink fabric health mask of the GPU (0: none reported)",
    "gpu_memory_used_bytes": "GPU memory in use, in bytes (DCGM_FI_DEV_FB_USED)",
    "gpu_memory_total_bytes": "GPU memory in all, in bytes (DCGM_FI_DEV_FB_USED + FB_FREE)",
    "gpu_power_watts": "Power the GPU draws now, in watts (DCGM_FI_DEV_POWER_USAGE)",
    "gpu_temperature_celsius": "GPU core temperature, in degrees Celsius (DCGM_FI_DEV_GPU_TEMP)",
    "gpu_sm_clock_mhz": "SM clock of the GPU now, in MHz (DCGM_FI_DEV_SM_CLOCK)",
    "nic_link_speed_mbps": "Link speed of the NIC now, in Mb/s (absent while down)",
    "nic_link_speed_expected_mbps": "Link speed the NIC is expected to run at, in Mb/s",
}


class Metrics:
    """The agent's metrics; implements the runtime's Telemetry hooks."""

    def __init__(self) -> None:
        self.registry = reg = Registry()
        self.rpc_seconds = reg.register(
            Histogram(
                "node_agent_rpc_duration_seconds",
                "Device-plugin RPC latency, by resource, method and status code",
                ["resource", "method", "code"],
                buckets=RPC_BUCKETS,
            )
        )
        self.allocations = reg.register(
            Counter("node_agent_allocations", "Allocate container requests served", ["resource"])
        )
        self.allocated_devices = reg.register(
            Counter("node_agent_allocated_devices", "Devices handed out by Allocate", ["resource"])
        )
        self.registrations = reg.register(
            Counter(
                "node_agent_registrations",
                "Successful registrations with the kubelet",
                ["resource"],
            )
        )
        self.health_events = reg.register(
            Counter(
                "node_agent_health_events",
                "Device health transitions, by reason",
                ["resource", "reason"],
            )
        )
        self.xids = reg.register(
            Counter(
                "node_agent_gpu_xid_errors",
                "XID events NVML delivered for the GPU, by XID (DCGM_FI_DEV_XID_ERRORS counted)",
                ["resource", "device", "xid"],
            )
        )
        self.degraded = reg.register(
            Gauge(
                "node_agent_device_degraded",
                "Whether the signal of the device is out of limits now (1) or was and is no "
                "more (0)",
                ["resource", "device", "signal"],
            )
        )
        self.signal_figures = reg.register(
            Gauge(
                "node_agent_device_signal_figure",
                "The figures behind a signal out of limits (e.g. width 8, maxWidth 16)",
                ["resource", "device", "signal", "figure"],
            )
        )
        self.readings_gauges = {
            name: reg.register(Gauge(f"node_agent_{name}", text, ["resource", "device"]))
            for name, text in READINGS.items()
        }
        self._signals: dict[tuple[str, str], set[str]] = {}  # series set to 1
        self._figures: dict[tuple[str, str], set[tuple[str, str]]] = {}
        self._devices = _DeviceCollector(list)
        self.registry.register(self._devices)
        self._fresh: list[Callable[[], Awaitable[None]]] = []

    def watch_resources(self, resources: Callable[[], Iterable[Resource]]) -> None:
        self._devices.resources = resources

    def add(self, collector: Collector, fresh: Callable[[], Awaitable[None]]) -> None:
        """Collect from `collector` too, after `fresh()` at each scrape (which must keep
        to its own short wait: the scrape waits for it)."""
        self.registry.register(collector)
        self._fresh.append(fresh)

    async def refresh(self) -> None:
        for fresh in self._fresh:
            await fresh()

    def rpc_done(self, resource: str, method: str, seconds: float, code: str) -> None:
        self.rpc_seconds.labels(resource, method, code).observe(seconds)

    def allocated(self, resource: str, devices: int) -> None:
        self.allocations.labels(resource).inc()
        self.allocated_devices.labels(resource).inc(devices)

    def registered(self, resource: str) -> None:
        self.registrations.labels(resource).inc()

    def health_event(self, change: DeviceHealth) -> None:
        reason = "recovered" if change.cause is None else change.cause.label
        self.health_events.labels(change.resource, reason).inc()

    def device_health(self, state: DeviceHealth) -> None:
        key = state.resource, state.device_id
        signals = signals_of(state.cause)
        out = {s.name for s in signals}
        for name in self._signals.get(key, set()) - out:
            self.degraded.labels(*key, name).set(0)  # recovered: the series stays, at 0
        for name in out:
            self.degraded.labels(*key, name).set(1)
        self._signals[key] = self._signals.get(key, set()) | out
        figures = {
            (s.name, k): float(v)
            for s in signals
            for k, v in s.figures().items()
            if isinstance(v, int | float)
        }
        for signal, figure in self._figures.get(key, set()) - set(figures):
            self.signal_figures.remove(*key, signal, figure)
        for (signal, figure), value in figures.items():
            self.signal_figures.labels(*key, signal, figure).set(value)
        self._figures[key] = set(figures)

    def readings(self, resource: str, device: str, values: Mapping[str, float | None]) -> None:
        for name, value in values.items():
            gauge = self.readings_gauges.get(name)
            if gauge is None:
                log.warning("metrics_reading_unknown", reading=name)  # a family's mistake
            elif value is None:
                with contextlib.suppress(KeyError):
                    gauge.remove(resource, device)  # not offered: no series
            else:
                gauge.labels(resource, device).set(value)

    def xid(self, resource: str, device: str, xid: int) -> None:
        self.xids.labels(resource, device, str(xid)).inc()

    def exposition(self) -> bytes:
        return self.registry.exposition()


class _DeviceCollector:
    """Device counts by health, read from the inventories at scrape time."""

    def __init__(self, resources: Callable[[], Iterable[Resource]]) -> None:
        self.resources = resources

    def collect(self) -> Iterator[Family]:
        devices = Family(
            "node_agent_devices",
            "Advertised devices, by resource and grade (Healthy, Degraded, Unhealthy)",
            ["resource", "health"],
        )
        for resource in self.resources():
            listed = resource.inventory.devices
            # Degraded whatever the kubelet is told of it (health.degraded.report).
            slow = sum(1 for d in listed if d.degraded)
            healthy = sum(1 for d in listed if d.healthy and not d.degraded)
            devices.add([resource.name, "Healthy"], healthy)
            devices.add([resource.name, "Degraded"], slow)
            devices.add([resource.name, "Unhealthy"], len(listed) - healthy - slow)
        yield devices
        info = Family("node_agent_build_info", "Build of the agent", ["version"])
        info.add([__version__], 1)
        yield info


# The port the DaemonSet serves on (docs/configuration.md#metrics-port): the default of
# no component commonly found on GPU nodes; the command line itself has no default.
METRICS_PORT = 17400


class MetricsServer:
    """A minimal HTTP/1.1 server for GET /metrics and GET /healthz, one request a connection."""

    def __init__(self, metrics: Metrics, address: str, healthy: Callable[[], bool]) -> None:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit() or int(port) > 65535:
            raise ConfigError(
                "--metrics-address", address, f"HOST:PORT, e.g. 0.0.0.0:{METRICS_PORT}"
            )
        self._host, self._port = host.strip("[]"), int(port)
        self._metrics = metrics
        self._healthy = healthy
        self._server: asyncio.base_events.Server | None = None
        self.bound = asyncio.Event()

    @property
    def port(self) -> int:
        """The port bound, which is the one asked for unless that was 0 (any free port)."""
        if self._server is None:
            raise RuntimeError("the metrics server is not started")
        sock: Any = self._server.sockets[0]
        return int(sock.getsockname()[1])

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self._host, self._port)
        log.info("metrics_serving", address=f"{self._host}:{self.port}")
        self.bound.set()

    async def stop(self) -> None:
        self.bound.clear()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def serve(self) -> None:
        """Serve until cancelled. Metrics are optional: if the address cannot be bound,
        that is logged and the agent goes on without them."""
        try:
            await self.start()
        except OSError as exc:
            log.error(
                "metrics_unavailable",
                address=f"{self._host}:{self._port}",
                error=str(exc),
                effect="device plugins keep serving; no /metrics or /healthz",
            )
            return
        try:
            await asyncio.Event().wait()  # until cancelled
        finally:
            await self.stop()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=READ_TIMEOUT_S)
            status, body, ctype = await self._respond(head)
            extra = "Allow: GET\r\n" if status.startswith("405") else ""
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n{extra}"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            pass  # a client that sent no complete request head gets nothing
        except ConnectionError:
            pass  # the client went away
        finally:
            writer.close()

    async def _respond(self, head: bytes) -> tuple[str, bytes, str]:
        parts = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            return "400 Bad Request", b"bad request\n", TEXT
        method, target, _ = parts
        return await self._route(method, target.split("?", 1)[0])

    async def _route(self, method: str, path: str) -> tuple[str, bytes, str]:
        if method != "GET":
            return "405 Method Not Allowed", b"GET only\n", TEXT
        if path == "/metrics":
            await self._metrics.refresh()
            return "200 OK", self._metrics.exposition(), CONTENT_TYPE
        if path == "/healthz":
            if self._healthy():
                return "200 OK", b"ok\n", TEXT
            return "503 Service Unavailable", b"not serving\n", TEXT
        return "404 Not Found", b"not found\n", TEXT

"""Prometheus metrics shared by every service (one registry per process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class ServiceMetrics:
    def __init__(self, service: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.service = service
        self.messages = Counter(
            "ckpt_ha_messages_total",
            "Consumed messages by outcome (ack, nak, dead_letter).",
            ["service", "consumer", "outcome"],
            registry=self.registry,
        )
        self.transitions = Counter(
            "ckpt_ha_checkpoint_transitions_total",
            "Checkpoint lifecycle transitions applied by the registry.",
            ["service", "from_state", "to_state"],
            registry=self.registry,
        )
        self.up = Gauge(
            "ckpt_ha_service_up", "1 while the service runs.", ["service"], registry=self.registry
        )

    def message(self, consumer: str, outcome: str) -> None:
        self.messages.labels(self.service, consumer, outcome).inc()

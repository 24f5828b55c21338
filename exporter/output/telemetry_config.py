"""The `limits` and `otlp` settings: light models the configuration reads without the SDK."""

from __future__ import annotations

from pydantic import Field

from exporter.core.models import StrictModel

DEFAULT_SERVICE_NAME = "queue-exporter"


class LimitsConfig(StrictModel):
    max_series_per_metric: int = Field(
        10_000,
        ge=2,
        description="samples per metric before label sets fold into overflow (a histogram "
        "series counts as its buckets plus _sum and _count)",
    )
    label_value_max_length: int = Field(128, ge=8, description="longer label values are cut")
    series_idle_timeout: float | None = Field(
        21600.0,
        gt=0,
        description="seconds after which an event series no batch updated is dropped (null: never)",
    )


class OtlpConfig(StrictModel):
    enabled: bool = Field(
        False, description="also push every metric over OTLP/HTTP (OTEL_EXPORTER_OTLP_* apply)"
    )
    interval: float = Field(15.0, gt=0, description="seconds between pushes")
    service_name: str = Field(
        DEFAULT_SERVICE_NAME,
        min_length=1,
        description="the resource's service.name, unless OTEL_SERVICE_NAME or "
        "OTEL_RESOURCE_ATTRIBUTES names one",
    )

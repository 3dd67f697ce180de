"""What a process tells its operators: logs, Prometheus metrics, OpenTelemetry traces, the
``/healthz``, ``/readyz`` and ``/metrics`` routes and which services are alive over NATS.
Nothing here imports another group of ``shared``."""

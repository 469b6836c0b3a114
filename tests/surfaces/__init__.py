"""What users and operators touch: the CLI, explain, the dashboard, metrics, the admin API, OpenTelemetry, asyncio,
docs, examples, packaging, Django and fakeredis."""

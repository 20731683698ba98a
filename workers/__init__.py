"""The GPU/CPU worker side of the farm: one pinned process per device running group trials from Celery."""

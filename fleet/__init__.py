"""What the fleet's two sides share: the wire protocol, fleet settings, worker presence, group results, the fleet's
own errors and the Celery configuration. ``farm_workers`` and ``farm_coordinator`` both import it; the core
(``farm``) never does."""

from farm_fleet import errors as errors  # registers the fleet's errors with farm.errors.error_from_dict

"""What the fleet's two sides share: the wire protocol, fleet settings, worker presence, group results and the
Celery configuration. ``farm_workers`` and ``farm_coordinator`` both import it; the core (``farm``) never does."""

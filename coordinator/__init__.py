"""The coordinator: expands a catalog into group tasks, aggregates results into decisions, publishes them."""

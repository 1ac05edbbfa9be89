"""Experiments behind ``p2pfaas eval``: the real system on a seeded workload, next to references."""

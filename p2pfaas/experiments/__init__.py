"""Experiments behind ``p2pfaas eval``: each runs the real system on a seeded workload
and reports its numbers next to the analytic references."""

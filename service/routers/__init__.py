"""One router per resource: plan, policies (+ admin), buckets/runs/measurements, health, dashboard."""

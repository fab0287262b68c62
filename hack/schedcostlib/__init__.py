"""`hack/scheduler_cost`: what publishing GPUs for shares costs the cluster's scheduler."""

"""`hack/cluster_sim`: many simulated nodes on one real API server and scheduler, a seeded
workload of GPU/NIC pair claims, and what the scheduler made of it."""

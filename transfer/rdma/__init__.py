"""RDMA transport through the verbs seam (pyverbs where the hardware exists, a fake in tests)."""

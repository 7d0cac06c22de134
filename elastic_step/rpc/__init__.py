"""Protocol buffers and gRPC stubs; regenerate with ``make proto``."""

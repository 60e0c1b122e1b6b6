"""The benchmark (`python -m scripts.bench`): one module per mode, the workload and the measuring beside them."""

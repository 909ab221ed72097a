"""The core below the methods: units, layouts, tasks, FLOPs, the client protocol, devices, seeds
and registries."""

"""The `tierproxy` command: serve, tier, status, config, loadtest. The top layer: it
may import every package; nothing imports it."""

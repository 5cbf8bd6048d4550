pytest_plugins = ["testbed.fixtures"]

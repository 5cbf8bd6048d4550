pytest_plugins = ["testbed.fixtures", "tests.helpers.fixtures"]

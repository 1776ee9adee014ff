"""The property suite's pytest set-up lives in dpsim's plugin (options, profiles)."""

pytest_plugins = ["dpsim.pytest_plugin"]

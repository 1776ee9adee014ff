"""The suite's options and profiles come from dpsim's pytest plugin.

It is registered through the ``pytest11`` entry point of the installed
package, so nothing is listed here: naming it in ``pytest_plugins`` as well
would register it twice.
"""

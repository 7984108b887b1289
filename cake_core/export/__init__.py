"""``cake export``: a problem's fastest kernel per shape as a self-contained package (docs/architecture.md §7, Exported dispatchers).

``routes`` (pure: measured rows -> routes), ``manifest`` (the JSON a package carries), ``package`` (writing the
folder), ``build`` (the steps, from rows to a package); ``dispatcher_template`` and ``cuda_driver`` are the
package's own modules, copied into it, and import the standard library only. Modules import each other by
their own paths; this package re-exports nothing.
"""

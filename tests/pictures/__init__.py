"""Pictures of the Grafana dashboards, drawn from a real Prometheus (``make dashboard-pictures``).

No Grafana can be installed where this project is built (it is in none of the package registries
reached: Debian, PyPI, npm), so the dashboards are not screenshotted: the proxy serves a scripted
load against the fake upstream, a real Prometheus scrapes it, every panel's queries run against
Prometheus as the dashboard writes them, and matplotlib draws the panels in the dashboard's grid.

``panels``: the dashboards' panels and their queries (no matplotlib); ``traffic``: the load;
``fetch``: the queries against Prometheus; ``draw``: the pictures; ``__main__``: all of it.
"""

CAPTION = "rendered from Prometheus with the dashboard's queries; not a Grafana screenshot"
"""On every picture, and in its PNG ``Description`` text chunk."""

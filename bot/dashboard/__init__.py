"""The admin dashboard: `python -m bot dashboard`, or beside `run` when DASHBOARD_PORT is set.

A read-only aiohttp application (bot.dashboard.app) over the same read-only database connection
as `admin sql` (bot.admin.sql.readonly_engine), with a password login (bot.dashboard.auth).
"""

from bot.dashboard.server import beside_service, check_settings, run_dashboard, start_dashboard

__all__ = ["beside_service", "check_settings", "run_dashboard", "start_dashboard"]

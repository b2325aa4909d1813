"""The read side: stats, admin reports, the variant report and the dashboard's queries."""

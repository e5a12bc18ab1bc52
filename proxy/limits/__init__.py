"""Rate limits and spend budgets per client, team and globally (``limits:`` of the policy)."""

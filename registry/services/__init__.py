"""Everything that changes registry rows; one module per concept. Views, tasks, commands and
the admin call these, nothing else writes."""

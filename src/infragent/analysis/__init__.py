"""Pure functions over traces and samples: statistics, breakdowns, attribution."""

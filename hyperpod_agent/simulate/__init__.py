"""Goodput simulator: ETTR of a large job under real faults and the controller's decisions."""

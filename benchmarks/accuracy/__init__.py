"""Cost-model accuracy: the roofline against measured profiles, and the SDPA backend rule against torch's choice."""

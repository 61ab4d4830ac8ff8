"""GPU notebook sessions in seconds, from warm GPU VM pools across regional clusters."""

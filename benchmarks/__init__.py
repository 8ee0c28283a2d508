"""GPU benchmarks of fusion-advisor, by purpose (README.md here). The package never imports them; tests neither."""

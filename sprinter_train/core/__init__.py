"""The pure pieces every layer shares: sampling, acceptance rules, distribution metrics, I/O,
device settings, plotting and config composition. Imports nothing else of the package."""

"""Where `pinwheel publish --to NAME` sends a verified release."""

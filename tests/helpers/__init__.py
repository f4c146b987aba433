"""Small models, data and scripts the tests train with."""

"""The migrations of the ``pgsolo`` app: one per version of pgsolo's schema, each
:func:`pgsolo.django.schema.to_version`'s operation."""

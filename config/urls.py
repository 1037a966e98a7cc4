from django.urls import include, path

# No django.contrib.admin: every admin change must go through a service that writes the
# audit log in the same transaction; the admin pages are built on those services.
urlpatterns = [
    path("", include("billing.urls")),
]

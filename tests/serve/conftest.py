# Fixtures live in serve_support.py so test modules can import its helpers by a name that does not collide with the
# other test folders' conftest modules when pytest runs several folders at once.
from serve_support import *  # noqa: F401,F403

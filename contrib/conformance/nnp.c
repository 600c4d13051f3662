/* A stand-in for the nonewprivs test image: installed setuid root, prints its effective uid. */
#include <stdio.h>
#include <unistd.h>
int main(void) { printf("Effective uid: %d\n", geteuid()); return 0; }

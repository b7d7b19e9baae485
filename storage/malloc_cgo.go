//go:build linux && cgo

package storage

/*
#include <malloc.h>

static int telha_malloc_trim(void) {
#ifdef __GLIBC__
	malloc_trim(0);
	return 1;
#else
	return 0;
#endif
}
*/
import "C"

func mallocTrim() bool { return C.telha_malloc_trim() == 1 }

/* For WHARF_FREESTANDING builds (no libc): what wharf.c provides. */
#ifndef WHARF_FREESTANDING_STDLIB_H
#define WHARF_FREESTANDING_STDLIB_H
#include <stddef.h>
void *malloc(size_t size);
void *calloc(size_t count, size_t size);
void *realloc(void *ptr, size_t size);
void free(void *ptr);
_Noreturn void abort(void);
#endif

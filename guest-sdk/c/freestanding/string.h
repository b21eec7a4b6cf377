/* For WHARF_FREESTANDING builds (no libc): what wharf.c provides. */
#ifndef WHARF_FREESTANDING_STRING_H
#define WHARF_FREESTANDING_STRING_H
#include <stddef.h>
void *memcpy(void *restrict dst, const void *restrict src, size_t n);
void *memmove(void *dst, const void *src, size_t n);
void *memset(void *dst, int c, size_t n);
int memcmp(const void *a, const void *b, size_t n);
size_t strlen(const char *s);
#endif

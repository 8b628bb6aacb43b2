# Finds hiredis (Debian libhiredis-dev 0.14 ships a header and a library but no CMake target)
# and defines the imported target PagedkvHiredis::hiredis. Sets PAGEDKV_HIREDIS_FOUND. Used by the
# build and, installed next to pagedkvConfig.cmake, by consumers of the package.
if(NOT TARGET PagedkvHiredis::hiredis)
  find_package(PkgConfig QUIET)
  if(PKG_CONFIG_FOUND)
    pkg_check_modules(PC_PAGEDKV_HIREDIS QUIET hiredis)
  endif()
  find_path(PAGEDKV_HIREDIS_INCLUDE_DIR hiredis/hiredis.h HINTS ${PC_PAGEDKV_HIREDIS_INCLUDE_DIRS})
  find_library(PAGEDKV_HIREDIS_LIBRARY NAMES hiredis HINTS ${PC_PAGEDKV_HIREDIS_LIBRARY_DIRS})
  if(PAGEDKV_HIREDIS_INCLUDE_DIR AND PAGEDKV_HIREDIS_LIBRARY)
    add_library(PagedkvHiredis::hiredis UNKNOWN IMPORTED)
    set_target_properties(PagedkvHiredis::hiredis PROPERTIES
      IMPORTED_LOCATION "${PAGEDKV_HIREDIS_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${PAGEDKV_HIREDIS_INCLUDE_DIR}")
  endif()
endif()
if(TARGET PagedkvHiredis::hiredis)
  set(PAGEDKV_HIREDIS_FOUND TRUE)
else()
  set(PAGEDKV_HIREDIS_FOUND FALSE)
endif()
